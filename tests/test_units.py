"""Single-process unit tests of the small pieces: shape headers, layouts, recipes."""

import pytest
import torch

from mpipe_hf.schedule.layout import balanced_layers, check_layers_per_stage
from mpipe_hf.runtime.p2p import ALIGN, decode_header, encode_header, pack, payload_size, unpack


def test_header_round_trip_carries_every_shape_and_dtype():
    payload = {"hidden_states": torch.zeros(2, 37, 64, requires_grad=True), "position_ids": torch.zeros(3, 2, 37,
               dtype=torch.int64), "image_features": torch.zeros(0, 64, dtype=torch.bfloat16),
               "mask": torch.zeros(5, dtype=torch.bool), "scalar": torch.tensor(3.0)}
    entries = decode_header(encode_header(payload))
    assert entries == [(k, v.dtype, v.requires_grad, tuple(v.shape)) for k, v in payload.items()]


def test_payload_packs_every_tensor_into_one_buffer_and_unpacks_bit_exact():
    torch.manual_seed(0)
    payload = {"mask": torch.tensor([True, False, True]), "hidden_states": torch.randn(2, 5, 3).requires_grad_(),
               "empty": torch.zeros(0, 4), "position_ids": torch.arange(6).view(3, 2),
               "half": torch.randn(7).half(), "scalar": torch.tensor(2.5, dtype=torch.bfloat16)}
    entries = decode_header(encode_header(payload))
    flat = pack([t for t in payload.values() if t.numel()])
    assert flat.dtype == torch.uint8 and flat.numel() == payload_size(entries)
    out = unpack(entries, flat.clone())
    assert list(out) == list(payload)
    for key, tensor in payload.items():
        got = out[key]
        assert (got.dtype, got.shape, got.requires_grad) == (tensor.dtype, tensor.shape, tensor.requires_grad), key
        assert torch.equal(got.detach().view(-1).view(torch.uint8), tensor.detach().reshape(-1).view(torch.uint8))
        if got.numel():
            assert got.storage_offset() * got.element_size() % ALIGN == 0, key
    storages = [t.untyped_storage().data_ptr() for t in out.values() if t.numel()]
    assert len(set(storages)) == len(storages), "no two received tensors share storage"
    single = torch.randn(4, 3)
    assert pack([single]).data_ptr() == single.data_ptr(), "one tensor is sent as it is, without a copy"


def test_packed_row_lengths_travel_in_the_header_and_arrive_on_the_host():
    """A packed micro's row lengths (``HEADER_KEYS``) go as header words, take no payload byte, and are rebuilt as a
    host int64 tensor next to the payload's tensors (a stage reads them as Python integers without a device
    read); a header key of another dtype is refused."""
    from mpipe_hf.runtime.wire import HEADER_KEYS, payload_tensors
    lengths = torch.tensor([5, 1, 7])
    payload = {"hidden_states": torch.randn(1, 13, 4), "packed_lengths": lengths}
    assert "packed_lengths" in HEADER_KEYS
    header = encode_header(payload)
    assert header[-3:] == [5, 1, 7]  # the last entry's values, as words
    entries = decode_header(header)
    tensors = payload_tensors(payload)
    assert len(tensors) == 1 and payload_size(entries) == tensors[0].numel() * 4
    out = unpack(entries, pack(tensors).clone())
    assert list(out) == list(payload) and torch.equal(out["hidden_states"], payload["hidden_states"])
    assert out["packed_lengths"].device.type == "cpu" and out["packed_lengths"].tolist() == [5, 1, 7]
    with pytest.raises(TypeError, match="packed_lengths"):
        encode_header({"packed_lengths": lengths.float()})  # int32 travels (cu_seqlens), a float does not


def test_header_rejects_unsupported_dtype():
    with pytest.raises(TypeError, match="complex"):
        encode_header({"x": torch.zeros(2, dtype=torch.complex64)})


def test_balanced_layers():
    assert balanced_layers(8, 8) == [1] * 8
    assert balanced_layers(10, 4) == [2, 3, 3, 2]
    assert balanced_layers(7, 2) == [4, 3]
    assert sum(balanced_layers(29, 6)) == 29
    with pytest.raises(ValueError, match="exceeds the model's 8 decoder layers"):
        balanced_layers(8, 16)


def test_layers_per_stage_is_checked():
    assert check_layers_per_stage([3, 1, 2, 2], 8, 4) == [3, 1, 2, 2]
    for bad in ([4, 4], [8, 0, 0, 0], [3, 3, 3, 3]):
        with pytest.raises(ValueError, match="layers_per_stage"):
            check_layers_per_stage(bad, 8, 4)


class FakeWork:
    """A work that completes when ``done`` is set (``wait`` blocks until then)."""

    def __init__(self):
        import threading
        self.done = threading.Event()

    def is_completed(self):
        return self.done.is_set()

    def wait(self, timeout=None):
        self.done.wait()
        return True


@pytest.mark.parametrize("threaded", [False, True])
def test_watchdog_waits_reports_first_error_and_times_out(threaded):
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from mpipe_hf.runtime import PeerFailed, Watchdog
    store = dist.HashStore()
    dog = Watchdog(store, "g", timedelta(seconds=0.3), threaded)
    dog.start_step()
    work = FakeWork()
    threading.Timer(0.05, work.done.set).start()
    dog.wait(work, "a receive")  # completes
    with pytest.raises(TimeoutError, match="never did not complete within"):
        dog.wait(FakeWork(), "never")
    other = Watchdog(store, "g", timedelta(seconds=30), False)
    other.start_step()
    assert other.report(ValueError("pipeline rank 2: bad image")) == ("ValueError", "pipeline rank 2: bad image")
    assert dog.report(RuntimeError("later")) == ("ValueError", "pipeline rank 2: bad image"), "first writer wins"
    with pytest.raises(PeerFailed):
        _wait_on(store, threaded)
    err = dog.first_error()
    assert type(err) is ValueError and str(err) == "pipeline rank 2: bad image"
    dog.start_step()
    dog.check()  # a new step starts clean


def _wait_on(store, threaded):
    from datetime import timedelta

    from mpipe_hf.runtime import Watchdog
    dog = Watchdog(store, "g", timedelta(seconds=30), threaded)
    dog.start_step()
    dog.wait(FakeWork(), "blocked receive")  # another rank failed: raises within CHECK_S, not after 30 s


@pytest.fixture(scope="module")
def tokenizer():
    """The Qwen2 BPE cut to 1,024 ranks, built once for the module (the layer counts do not read the
    vocabulary)."""
    from mpipe_hf.data import qwen2_tokenizer
    return qwen2_tokenizer(1024)


@pytest.mark.parametrize("family,kwargs,match", [
    ("qwen2_5_vl", dict(text_layers=2), "text_layers = 2 exceeds stage 0's first chunk of 1"),
    ("qwen2_5_vl", dict(text_layers=-1), "text_layers must be an integer >= 0"),
    ("qwen2", dict(text_layers=0), "text_layers must be >= 1 with preprocess 'trainable'"),
    ("llama", dict(layers_per_stage=[3, 1, 2, 2], text_layers=4), "exceeds stage 0's first chunk of 3"),
])
def test_text_layers_are_checked_against_stage0(tokenizer, family, kwargs, match):
    from mpipe_hf.models import get_family
    from mpipe_hf.families.qwen.tiny import tiny_qwen2_5_vl_config
    from mpipe_hf.families.text.tiny import tiny_causal_lm_config
    from mpipe_hf.schedule import ScheduleConfig
    config = tiny_qwen2_5_vl_config(tokenizer) if family == "qwen2_5_vl" else tiny_causal_lm_config(tokenizer, family)
    cfg = ScheduleConfig(4, 2 if "layers_per_stage" not in kwargs else 1, 4, "trainable")
    with pytest.raises(ValueError, match=match):
        get_family(family).layer_counts(config, cfg, kwargs.get("layers_per_stage"), kwargs["text_layers"])
    assert get_family(family).layer_counts(config, cfg, kwargs.get("layers_per_stage"), 1)[0] >= 1


def test_split_is_one_entry_point_that_names_the_supported_model_types():
    import re

    from transformers import GPT2Config, GPT2LMHeadModel

    from mpipe_hf.models import FAMILIES, split
    from mpipe_hf.schedule import ScheduleConfig
    assert {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "llama", "qwen2", "qwen3", "qwen3_5", "qwen3_5_moe",
            "qwen3_vl_moe", "glm4v", "glm4v_moe", "internvl", "gemma3", "paligemma", "mistral3", "llava_next",
            "llava_onevision", "idefics3", "smolvlm"} <= set(FAMILIES)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    with pytest.raises(ValueError, match=r"model_type 'gpt2' has no splitter; supported model_type values: "
                                         + re.escape(str(sorted(FAMILIES)))):
        split(model, ScheduleConfig(2, 1, 2), 0)


def test_a_family_registered_from_its_own_file_is_what_split_uses():
    from types import SimpleNamespace

    from transformers import MistralConfig, MistralForCausalLM

    from mpipe_hf.models import FAMILIES, register, split, unregister
    from mpipe_hf.schedule import ScheduleConfig
    calls = []
    decoder_only = FAMILIES["llama"]  # a declaration: Family(text="model")
    family = SimpleNamespace(layer_counts=decoder_only.layer_counts,
                             split=lambda *args: calls.append(args) or decoder_only.split(*args))
    with pytest.raises(ValueError, match="needs callables layer_counts and split; .* lacks \\['split'\\]"):
        register("mistral", SimpleNamespace(layer_counts=decoder_only.layer_counts))
    register("mistral", family)
    try:
        model = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                 head_dim=8))
        carved = split(model, ScheduleConfig(2, 1, 2, "identity"), 1)
        assert len(calls) == 1 and list(carved.stages) == [1] and carved.layout[1][-1] == "lm_head"
    finally:
        unregister("mistral")


@pytest.mark.parametrize("per_micro", [True, False])
def test_a_micro_without_label_tokens_adds_no_moe_aux_loss(per_micro):
    """A null micro-batch (every row failed to load: no label token) adds no load-balancing term and no gradient
    to it, under either loss normalisation; a micro with tokens adds its term (``runtime.aux_loss.with_aux``)."""
    from types import SimpleNamespace

    from mpipe_hf.runtime.aux_loss import with_aux
    for tokens, expect in ((0, 0.0), (5, 0.25)):
        ctx = SimpleNamespace(per_micro=per_micro, aux_sum=0.0, aux_micros=0)
        aux = torch.tensor(0.05, requires_grad=True)
        out, term = with_aux(ctx, {"loss": torch.tensor(1.0), "num_tokens": torch.tensor(tokens), "aux_loss": aux})
        added = term if per_micro else out["loss"] - 1.0  # micro: the term after the division; tokens: aux * n
        (added * 1.0).backward()
        assert abs(float(added) - (expect / 5 if per_micro else expect)) < 1e-7 and ctx.aux_micros == 1
        assert float(aux.grad) == (0.0 if tokens == 0 else (1.0 if per_micro else 5.0))


def test_a_layer_type_without_a_mask_builder_is_refused_when_the_stage_is_built():
    from mpipe_hf.models.decoder import check_layer_types
    check_layer_types(["full_attention", "sliding_attention", "linear_attention"])
    with pytest.raises(ValueError, match=r"layer types \['mystery'\] have no mask builder .* supported: "):
        check_layer_types(["full_attention", "mystery"])


def test_the_summary_of_a_resumed_run_counts_the_steps_this_process_ran():
    """A run resumed at step 8 of 20 ran 12 steps here; the summary says so, not "20 steps"."""
    from types import SimpleNamespace
    from mpipe_hf.train.report import summary_line
    run = SimpleNamespace(cfg=SimpleNamespace(pp_size=2), skips=SimpleNamespace(total=0, bad_rows=0))
    job = SimpleNamespace(steps=20, start_step=8, run=run, bubbles=[[0.1, 0.2]] * 12, peaks=[[2 ** 20] * 2] * 12,
                          losses=[2.0] * 12)
    line = summary_line(job, 3.8, "out")
    assert line.startswith("mpipe_hf: 12 steps (resumed at step 8 of 20) in 3.8s"), line
    fresh = summary_line(SimpleNamespace(**{**vars(job), "start_step": 0}), 3.8, "out")
    assert fresh.startswith("mpipe_hf: 20 steps in 3.8s"), fresh
