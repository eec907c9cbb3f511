"""Context parallelism's attention (``mpipe_hf/runtime/context_parallel.py``, Ulysses): real transformers decoder
layers, their sequence split over 2 gloo processes (one torchrun, ``tests/dist/context_parallel_worker.py``), equal
to the same layers on one process: the output, the input gradient and every parameter gradient (summed over the
two ranks), within fp32 rounding. The masks and positions are built on the whole sequence; the negative controls,
built from each rank's own slice, differ, and the split attention refuses a slice's mask by name."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "dist"))
from common import read_results, run_torchrun  # noqa: E402
from matrix import strict_grad_problems  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dist", "context_parallel_worker.py")
# fp32: the split attention computes each head as one process does (measured on a CPU: the output and the input
# gradient bit for bit); a parameter gradient is a sum over the two ranks' tokens in another order (measured: at
# most 5.4e-7 of its max|ref|)
OUT_REL = 1e-6
GRAD_REL = 1e-5  # per parameter tensor, of its max|ref| (tests/dist/matrix.strict_grad_problems)
CONTROL_REL = 1e-2  # a negative control differs from one process by more than this of max|ref| on some rank
CASES = [
    # causal, no padding: sdpa's mask skipped (None), its causal kernel over the whole sequence; 2 KV heads
    dict(name="qwen2-causal-sdpa", family="qwen2", attn="sdpa"),
    # causal, a padded second row, 2 KV heads (one block per rank)
    dict(name="qwen2-causal-padded-sdpa", family="qwen2", attn="sdpa", padded=True),
    # a packed micro-batch of two rows, each its own positions; the first row crosses the split, and the
    # ranks hold 10 and 14 tokens (a split balanced by cost need not be even)
    dict(name="qwen2-packed-uneven-sdpa", family="qwen2", attn="sdpa", rows=[13, 11], lengths=[10, 14]),
    # a sliding-window layer then a global one, bidirectional image blocks (one across the split), 6 heads on 3 KV
    # heads (each repeated twice, so that 2 ranks can split them); under sdpa and under Gemma 3's own eager function
    dict(name="gemma3-sliding-images-sdpa", family="gemma3", attn="sdpa"),
    dict(name="gemma3-sliding-images-eager", family="gemma3", attn="eager"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("context-parallel"))
    run_torchrun(WORKER, 2, [out, json.dumps(CASES)], timeout=300)
    return read_results(out, 2)


def problems(res: dict) -> list[str]:
    """What differs from one process beyond fp32 rounding on one rank."""
    out = [f"{key} differs by {d:.3g} of max|ref| {top:.3g}" for key in ("out", "in_grad")
           for top, d in [res[key]] if d > OUT_REL * top]
    out += [f"no gradient for {n}" for n in res["missing"]]
    return out + strict_grad_problems(res["grads"], GRAD_REL)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_split_attention_equals_one_process(case, results):
    per_rank = [r[case["name"]] for r in results]
    for rank, res in enumerate(per_rank):
        assert res["attn"].startswith("mpipe_ulysses_"), res["attn"]
        assert res["lengths"] == case.get("lengths", [12, 12]), res["lengths"]
        # the whole sequence's masks under the Ulysses name: skipped only for plain causal sdpa
        assert all(res["masks"].values()) == (case["name"] != "qwen2-causal-sdpa"), res["masks"]
        assert not problems(res), (rank, problems(res))
    print({case["name"]: {k: max(r[k][1] / r[k][0] for r in per_rank) for k in ("out", "in_grad")}
           | {"grads": max(d / top for r in per_rank for top, d in r["grads"].values())}})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_masks_and_positions_after_the_split_differ(case, results):
    """Negative controls: each rank's slice run alone (its masks and positions built from it), and the split
    attention given positions counted from 0 on every rank, differ from one process; the split attention given
    the slice's mask raises, naming the cause."""
    per_rank = [r[case["name"]] for r in results]
    for key in ("half", "positions_after_split"):
        assert max(d / top for top, d in (r[key] for r in per_rank)) > CONTROL_REL, (key, per_rank)
    for res in per_rank:
        assert "build the masks and positions on the whole sequence" in res["half_mask_error"], res


def test_kv_heads_are_repeated_to_the_fewest_that_cp_splits():
    """``kv_repeats``: none where ``cp`` divides the KV heads, else the fewest repeats that ``cp`` divides and
    that divide the heads; ``cp`` not dividing the heads is refused with the numbers."""
    from mpipe_hf.runtime.context_parallel import kv_repeats
    assert [kv_repeats(4, 2, 2), kv_repeats(6, 3, 2), kv_repeats(8, 1, 4), kv_repeats(16, 4, 8),
            kv_repeats(12, 4, 6)] == [1, 2, 4, 2, 3]
    for heads, kv, cp in [(4, 2, 3), (4, 4, 8)]:
        with pytest.raises(ValueError, match=f"cp \\({cp}\\) to divide the attention heads \\({heads}\\)"):
            kv_repeats(heads, kv, cp)


def test_ulysses_wraps_sdpa_and_eager_only_and_without_a_split_is_the_model_s_own():
    """``use_ulysses`` names the wrapper of the config's attention (again on a config set already), refuses
    FlashAttention by name; a real Qwen2 layer under the wrapper, called without ``sequence_split``, gives its
    own attention's output bit for bit (one process, no group)."""
    import torch
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    from mpipe_hf.models.tiny import non_degenerate
    from mpipe_hf.runtime.context_parallel import use_ulysses
    config = Qwen2Config(hidden_size=32, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=1, vocab_size=8)
    config._attn_implementation = "flash_attention_2"
    with pytest.raises(NotImplementedError, match="flash_attention_2"):
        use_ulysses(config)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer, hidden = non_degenerate(Qwen2DecoderLayer(config, 0)), torch.randn(1, 6, 32)
    rope = Qwen2RotaryEmbedding(config)(hidden, torch.arange(6)[None])
    want = layer(hidden, position_embeddings=rope)
    assert use_ulysses(config) == use_ulysses(config) == "mpipe_ulysses_sdpa"
    assert torch.equal(layer(hidden, position_embeddings=rope), want)


def test_cp_size_is_validated_by_name_before_launch():
    """``parallel.cp_size``: an integer >= 1, with ``ep_size`` dividing ``dp_size x cp_size``; against the model,
    heads and KV heads that Ulysses cannot split and layer types with a state along the sequence (Qwen3.5's linear
    attention) are refused by name; a Qwen2 of 4 heads on 2 KV heads takes cp 1, 2 and 4."""
    from transformers import Qwen2Config, Qwen3_5TextConfig

    from mpipe_hf.train.checks import check_context_parallel
    from mpipe_hf.train.recipe_parallel import ParallelSection
    assert ParallelSection(pp_size=2, num_micro=4, cp_size=2).cp_size == 2
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="parallel.cp_size must be an integer >= 1"):
            ParallelSection(pp_size=2, num_micro=4, cp_size=bad)
    # with ep: the EP groups are cut from the dp x cp ranks of a stage (tests/test_ep.py runs cp 2 x ep 2 x pp 2)
    assert ParallelSection(pp_size=2, num_micro=4, dp_size=1, ep_size=2, cp_size=2).ep_size == 2
    with pytest.raises(ValueError, match="parallel.ep_size must be .* divides parallel.dp_size x parallel.cp_size "
                                         "\\(1 x 2 = 2"):
        ParallelSection(pp_size=2, num_micro=4, dp_size=1, ep_size=4, cp_size=2)
    from mpipe_hf.train.hf_parts import MPipeConfig  # the HF Trainer route takes cp_size (tests/test_hf_trainer.py)
    assert MPipeConfig(pp_size=2).cp_size == 1 and MPipeConfig(pp_size=2, cp_size=2).cp_size == 2
    with pytest.raises(ValueError, match="cp_size must be an integer >= 1"):
        MPipeConfig(pp_size=2, cp_size=0)
    qwen2 = Qwen2Config(hidden_size=32, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                        num_hidden_layers=2, vocab_size=8)
    for cp in (1, 2, 4):
        check_context_parallel(qwen2, cp)
    with pytest.raises(ValueError, match="parallel.cp_size: .*cp \\(3\\) to divide the attention heads \\(4\\)"):
        check_context_parallel(qwen2, 3)
    gated = Qwen3_5TextConfig(hidden_size=32, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                              num_hidden_layers=2, vocab_size=8,
                              layer_types=["linear_attention", "full_attention"])
    check_context_parallel(gated, 1)
    with pytest.raises(ValueError, match="layers of type \\['linear_attention'\\] carry a state along the sequence"):
        check_context_parallel(gated, 2)


def test_packing_is_refused_by_name_only_where_the_masks_cannot_see_the_rows():
    """``data.packing`` with ``cp_size > 1``: a family whose masks see the packed rows (Qwen2.5-VL, Qwen2) passes
    before launch; one whose masks run the rows one by one (Gemma 3's and PaliGemma's token-type blocks, Molmo2's)
    is refused naming the model type, and passes at cp_size 1 or without packing. A stage meets the same refusal
    when a packed micro of several rows reaches it under a split, and one row is no packed micro."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoConfig

    from mpipe_hf.models.decoder import DecoderStage, check_packed_split
    from mpipe_hf.models.packed import ROW_BLIND
    from mpipe_hf.train.checks import check_context_parallel_packing
    for model_type in ("qwen2_5_vl", "qwen2"):
        check_context_parallel_packing(AutoConfig.for_model(model_type), 2, True)
    for model_type in ("gemma3", "paligemma", "molmo2"):
        config = AutoConfig.for_model(model_type)
        check_context_parallel_packing(config, 1, True)
        check_context_parallel_packing(config, 2, False)
        with pytest.raises(ValueError, match=f"data.packing: true for {model_type}, whose masks .* cannot see packed"):
            check_context_parallel_packing(config, 2, True)

    def blind(*args):
        return {}
    setattr(blind, ROW_BLIND, True)
    stage = DecoderStage(None, [], [], [], torch.nn.Identity(), SimpleNamespace(_attn_implementation="sdpa"),
                         masks=blind)
    check_packed_split(stage, {"packed_lengths": torch.tensor([5])})
    with pytest.raises(NotImplementedError, match="packed micro-batch of DecoderStage, whose masks"):
        check_packed_split(stage, {"packed_lengths": torch.tensor([5, 3])})
    check_packed_split(DecoderStage(None, [], [], [], torch.nn.Identity(), stage.text_config),
                       {"packed_lengths": torch.tensor([5, 3])})


def test_stages_with_per_token_hooks_or_routers_are_refused_by_name():
    """``split_sequences`` refuses a stage whose layers take per-token inputs the split does not cut (a subclass
    overriding ``after_layer`` without declaring ``hooks_cut_sequence``); a plain stage, one that declares it (as
    DeepStack does), and one with MoE router sums (summed over the CP group) are set."""
    from types import SimpleNamespace

    import torch

    from mpipe_hf.models.decoder import DecoderStage
    from mpipe_hf.models.context_parallel_stages import split_sequences

    class Deep(DecoderStage):
        def after_layer(self, layer_id, hidden, state):
            return hidden

    def stage(cls=DecoderStage, router=None):
        out = cls(None, [], [], [], torch.nn.Identity(), SimpleNamespace(_attn_implementation="sdpa"))
        out.router = router
        return out
    assert split_sequences([stage()], group="g") == 1
    with pytest.raises(NotImplementedError, match="does not cut Deep's after_layer"):
        split_sequences([stage(Deep)], group="g")
    declared = type("Declared", (Deep,), {"hooks_cut_sequence": True})
    assert split_sequences([stage(declared), stage(router=object())], group="g") == 2
