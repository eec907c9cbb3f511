"""NCCL transfers with their headers on the host (no host synchronisation per receive).

Two pipeline ranks in one process: their header groups are real gloo groups (two ``ProcessGroupGloo`` pairs over
loopback), their data groups are fakes standing for NCCL (``test_connect``'s: each records its sends and receives
and the CUDA stream current at the call), CUDA streams and events are faked, and the device is emulated on the CPU
(:mod:`device_model`), which counts every read of device memory by the host. A few seconds.
"""

import threading
import types
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from device_model import DEVICE, DeviceModel, on_device
from test_connect import fake_cuda, fake_pairs

from mpipe_hf.runtime import groups as groups_module
from mpipe_hf.runtime.p2p import CONNECT, FIRST_BYTES, P2P, WORDS, decode_header, encode_header, payload_size
from mpipe_hf.runtime.watchdog import Watchdog


class Recorded:
    """A real group whose sends and receives are logged as ``(call, peer, numel, stream current then)``."""

    def __init__(self, group, log):
        self.group, self.log = group, log

    def rank(self):
        return self.group.rank()

    def size(self):
        return self.group.size()

    def send(self, tensors, dst, tag):
        self.log.append(("header send", dst, tensors[0].numel(), str(torch.cuda.current_stream())))
        return self.group.send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        self.log.append(("header recv", src, tensors[0].numel(), str(torch.cuda.current_stream())))
        return self.group.recv(tensors, src, tag)


class CountingWatchdog(Watchdog):
    """A real watchdog that notes which of its waits each host wait was: ``wait`` (polled) or ``block``."""

    def __init__(self, log):
        super().__init__(dist.HashStore(), "p2p-headers", timedelta(seconds=30), threaded=True)
        self.log = log

    def wait(self, work, what):
        self.log.append(("host wait", str(what)))
        return super().wait(work, what)

    def block(self, work, what):
        self.log.append(("host block", str(what)))
        return super().block(work, what)


def gloo_pairs(names=("up", "down")):
    """``{rank: [group per name]}``: real gloo groups of two ranks in this process, over loopback."""
    store, made = dist.HashStore(), {0: [], 1: []}

    def make(rank):
        for name in names:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timedelta(seconds=30)
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            made[rank].append(dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, 2, options))
    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return made


@pytest.fixture
def ranks(monkeypatch):
    """``(sender, receiver, sender's log, receiver's log)``: ranks 0 and 1, each a P2P on the emulated device
    taking the CUDA path, with fake NCCL data groups and real gloo header groups."""
    with fake_cuda(monkeypatch):
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args, **kwargs: self)  # host memory here
        gloo, queues, logs, made = gloo_pairs(), {}, ([], []), []
        for rank in (0, 1):
            headers = tuple(Recorded(group, logs[rank]) for group in gloo[rank])
            p2p = P2P(rank, fake_pairs(rank, queues, logs[rank], 2), DEVICE, CountingWatchdog(logs[rank]),
                      headers=headers)
            p2p.cuda = True  # NCCL's path: streams (faked), buffers on the (emulated) device
            made.append(p2p)
        yield made[0], made[1], logs[0], logs[1]
        for p2p in made:
            p2p.watchdog.close()


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, to compare two tensors bit for bit (NaNs included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(got: dict, sent: dict) -> None:
    assert list(got) == list(sent)
    for key, tensor in sent.items():
        assert (got[key].dtype, got[key].shape, got[key].requires_grad) == (tensor.dtype, tensor.shape,
                                                                            tensor.requires_grad), key
        assert torch.equal(bits(got[key]), bits(tensor)), key


def round_trip(sender, receiver, payloads):
    """Send ``payloads`` from rank 0 to rank 1 and receive them on the emulated device: ``(received, syncs)``,
    ``syncs`` counting every host read of device memory during the receives."""
    for i, payload in enumerate(payloads):
        sender.send(payload, 1, f"0SEND_F{i}@1")
    with DeviceModel() as model:
        receiver.expect([0] * len(payloads))
        got = [receiver.recv(0, f"1RECV_F{i}@0") for i in range(len(payloads))]
    sender.drain()
    receiver.drain()
    return got, model.syncs


def mixed() -> dict:
    """Every dtype on the wire, a tensor that needs its gradient, a non-contiguous one, and NaN/inf bits."""
    x = torch.randn(2000)
    x[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    return {"x": x, "h": torch.randn(4, 5).to(torch.bfloat16).requires_grad_(), "f16": torch.randn(7).half(),
            "f64": torch.randn(3, dtype=torch.float64), "ids": torch.arange(11), "i32": torch.arange(5).int(),
            "i16": torch.arange(6, dtype=torch.int16), "i8": torch.arange(-4, 4, dtype=torch.int8),
            "u8": torch.arange(9, dtype=torch.uint8), "mask": torch.rand(3, 4) > 0.5, "t": torch.randn(3, 5).t()}


def test_receives_read_no_device_memory_headers_over_gloo_payloads_on_the_side_stream(ranks):
    """The receiver: each header over the header group on the host, each payload over the data group, issued on
    the side stream, one message per transfer (a small one too); no host read of device memory, no host wait
    for a payload; the tensors arrive bit for bit, on the device."""
    sender, receiver, _, log = ranks
    small, large = {"ids": torch.arange(3)}, mixed()
    got, syncs = round_trip(sender, receiver, [small, large])
    assert syncs == {}, f"host reads of device memory while receiving: {syncs}"
    same(got[0], small)
    same(got[1], large)
    assert all(on_device(t) for received in got for t in received.values())
    assert [e for e in log if e[0] == "header recv"] == [("header recv", 0, FIRST_BYTES, "compute")] * 2, \
        "both headers over the header group, on the host"
    sizes = [payload_size(decode_header(encode_header(p))) for p in (small, large)]
    assert [(e[2], str(e[3])) for e in log if e[0] == "recv"] == [(sizes[0], "side"), (sizes[1], "side")], \
        "every payload over the data group, issued on the side stream"
    assert [e[1] for e in log if e[0] == "host wait"] == [], "no polled host wait for a payload"
    assert [e[1] for e in log if e[0] == "host block"] == ["1RECV_F0@0 from pipeline rank 0",
                                                           "1RECV_F1@0 from pipeline rank 0"], \
        "the host waits for the headers only, each a blocking (breakable) gloo wait"


def test_sends_pack_the_header_on_the_host_and_the_payload_as_one_device_buffer(ranks):
    """The sender: the header words written on the host and sent over the header group, every tensor's bytes as
    one message over the data group (never inline in the header: that copy would wait for the device); nothing
    of the device read by the host. Only data-group uses are first uses, and the connect prologue makes them."""
    sender, receiver, log, _ = ranks
    for p2p, pairs in ((sender, [(0, 1)]), (receiver, [(0, 1)])):
        p2p.connect(pairs)  # (the fake data group delivers at once: the sender's token first)
    with DeviceModel() as model:
        small = {"ids": torch.arange(3, device=DEVICE), "m": torch.ones(2, 2, device=DEVICE)}
        sender.send(small, 1, "0SEND_F0@1")
    assert model.syncs == {}, f"host reads of device memory while sending: {model.syncs}"
    assert [e for e in log if e[0] == "header send"] == [("header send", 1, FIRST_BYTES, "compute")]
    assert [e[2] for e in log if e[0] == "send"] == [1, payload_size(decode_header(encode_header(small)))], \
        "the connect token, then one payload buffer"
    receiver.expect([0])
    same(receiver.recv(0, "1RECV_F0@0"), small)
    sender.drain()
    assert sender.first_uses == [("0->1", 1, CONNECT)] and receiver.first_uses == [("0->1", 0, CONNECT)]
    assert sender.stray_first_uses() == receiver.stray_first_uses() == []


def test_a_long_header_continues_over_the_header_group(ranks):
    """Many keys: the header's rest follows over the header group, read on the host too; the payload is still
    one data-group message."""
    sender, receiver, _, log = ranks
    many = {f"layer{i}.weight": torch.randn(2, 3) for i in range(200)}
    assert len(encode_header(many)) > WORDS - 1, "the header does not fit in the first message"
    got, syncs = round_trip(sender, receiver, [many, {"after": torch.arange(4)}])
    assert syncs == {}, syncs
    same(got[0], many)
    same(got[1], {"after": torch.arange(4)})
    rest = len(encode_header(many)) - WORDS + 1
    assert [e[2] for e in log if e[0] == "header recv"] == [FIRST_BYTES, rest, FIRST_BYTES]
    assert len([e for e in log if e[0] == "recv"]) == 2


def test_headers_with_host_values_are_not_kept_as_plans(ranks):
    """A header that carries host values (grids, boundaries) differs from micro to micro: the receiver builds its
    plan and does not keep it (the cache would fill with headers seen once); a header of shapes alone is kept."""
    sender, receiver, _, _ = ranks
    x = torch.randn(6, device=DEVICE)
    payloads = [{"x": x, "image_grid_thw": torch.tensor([[1, 2 * i + 2, 4]])} for i in range(3)] + [{"x": x}]
    got, syncs = round_trip(sender, receiver, payloads)
    assert syncs == {} and [g["image_grid_thw"][0, 1].item() for g in got[:3]] == [2, 4, 6]
    assert len(receiver._plans) == 1, "only the header of shapes alone"


def test_empty_tensors_and_an_empty_dictionary_need_no_payload(ranks):
    """Empty tensors keep their shapes and dtypes; a transfer of nothing but empty tensors, or of no tensor at
    all, is its header alone."""
    sender, receiver, slog, rlog = ranks
    empties = {"a": torch.empty(0, 3), "b": torch.empty(2, 0, dtype=torch.int64)}
    some = {"a": torch.empty(0), "x": torch.randn(5), "b": torch.empty(0, dtype=torch.bool)}
    got, syncs = round_trip(sender, receiver, [empties, {}, some])
    assert syncs == {}, syncs
    same(got[0], empties)
    assert got[1] == {}
    same(got[2], some)
    assert [e[2] for e in slog if e[0] == "send"] == [20], "one payload message: x's 20 bytes"
    assert [e[2] for e in rlog if e[0] == "recv"] == [20]
    assert len([e for e in rlog if e[0] == "header recv"]) == 3


class FakeNew:
    """What ``dist.new_group`` makes here: a group that knows its backend and how it was made."""

    def __init__(self, backend, local):
        self.backend, self.local, self.group_name = backend, local, f"g{id(self)}"

    def rank(self):
        return 0


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_fresh_groups_add_gloo_header_groups_on_nccl_only(monkeypatch, backend):
    """NCCL data groups come with two gloo header groups (made locally synchronised, like the others), which the
    P2P gets, the watchdog breaks on a failure (they are among its groups) and watches (threaded), and a closed
    executor hands on with the rest; gloo groups come without."""
    default = backend  # the world's backend, which new_group takes unless told
    monkeypatch.setattr(groups_module, "member_group", lambda ranks, base, timeout, backend=None, split=True:
                        FakeNew(backend or default, True))
    monkeypatch.setattr(dist, "get_backend", lambda group: group.backend)
    monkeypatch.setattr(groups_module, "IDLE_GROUPS", {})
    monkeypatch.setattr(groups_module, "alive", lambda group: True)  # the fakes are in no world
    ex = types.SimpleNamespace(global_ranks=[0, 1], rank=0, timeout=timedelta(seconds=5), store=dist.HashStore(),
                               _shared=None, device=torch.device("cpu"), _stale=[], control=None)
    groups_module.fresh_groups(ex)
    headers = ex.p2p.headers
    if backend == "gloo":
        assert headers is None and len(ex.watchdog.groups) == 3 and ex.votes is ex.group
    else:
        assert [(g.backend, g.local) for g in headers] == [("gloo", True)] * 2
        assert ex.watchdog.groups[3:5] == list(headers) and ex.watchdog.threaded
        assert ex.votes.backend == "gloo" and ex.watchdog.groups[5:] == [ex.votes], "the votes' gloo group"
        assert all(g.backend == "nccl" and g.local for g in (ex.group, *ex.p2p.pairs.values()))
    assert sorted(ex.p2p.pairs) == [(0, 1), (1, 0)], "a group per directed pair"
    groups_module.close(ex)
    again = types.SimpleNamespace(**{k: v for k, v in vars(ex).items() if k not in ("p2p", "watchdog")})
    groups_module.fresh_groups(again)
    assert again.p2p.headers == headers and again.watchdog.groups == ex.watchdog.groups, "reused when idle"
