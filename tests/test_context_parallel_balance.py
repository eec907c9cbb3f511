"""Balance by cost under context parallelism: the cost model of each CP rank's work
(``mpipe_hf/schedule/context_parallel_cost.py``, pure), the figures it gives (an even split is balanced for the
layers under Ulysses, not under ring attention; a tower item the ranks cannot share is not), and the costliest rank
over the mean in ``mpipe-hf train``'s progress line and in ``mpipe-hf check-data``'s summary."""

import os
from types import SimpleNamespace

import pytest

from mpipe_hf.schedule.context_parallel_cost import (CostWeights, MicroWork, causal_pairs, costliest_over_mean,
                                                     even_lengths, rank_work, ring_pairs)


def test_the_split_and_the_pairs_are_counted_as_the_stages_and_the_masks_make_them():
    """The even split is ``SequenceSplit.even``'s; a causal mask's pairs are per packed row (no pair across rows)
    and per padded row over the longest; ring attention's contiguous slices take ``(2 r + 1) / cp^2`` of them."""
    assert even_lengths(10, 4) == (3, 3, 2, 2) and even_lengths(8, 2) == (4, 4)
    with pytest.raises(ValueError, match="at least 1 rank"):
        even_lengths(8, 0)
    assert causal_pairs(MicroWork((3, 2), packed=True)) == 6 + 3
    assert causal_pairs(MicroWork((3, 2))) == 2 * 6
    assert ring_pairs((2, 2)) == [3, 7] and sum(ring_pairs((3, 3, 2))) == causal_pairs(MicroWork((8,)))
    shares = ring_pairs(even_lengths(4096, 4))
    assert shares[-1] / (sum(shares) / 4) == pytest.approx(1.75, abs=1e-3)


def test_each_rank_s_work_is_its_tokens_a_cp_th_of_the_pairs_and_its_tower_items():
    """Ulysses' attention share is ``1 / cp`` of the pairs whatever the split (an uneven one included); the tower
    items go to the ranks by ``divide_tower`` (LPT); padding counts as tokens; a bad split is refused."""
    weights = CostWeights(pair=0.5, patch=2.0)
    micro = MicroWork((6, 4), packed=True, items=(5, 3, 2))  # LPT: 5 -> rank 0, 3 and 2 -> rank 1
    attention = 0.5 * (21 + 10) / 2
    assert rank_work(micro, 2, weights) == [5 + attention + 10, 5 + attention + 10]
    assert rank_work(micro, 2, weights, (1, 9)) == [1 + attention + 10, 9 + attention + 10]
    one = MicroWork((8,), items=(6,))
    assert rank_work(one, 2, CostWeights(0.0, 1.0)) == [4 + 6, 4]
    padded = MicroWork((2, 8))
    assert rank_work(padded, 2, CostWeights(0.0, 0.0)) == [8, 8]  # 2 rows x 4 positions each
    with pytest.raises(ValueError, match="do not split a sequence of 10 tokens"):
        rank_work(micro, 2, weights, (4, 4))


def test_the_costliest_rank_over_the_mean_is_summed_over_the_micros():
    assert costliest_over_mean([[1, 3], [2, 2]]) == pytest.approx(5 / 4)
    assert costliest_over_mean([]) == 1.0 and costliest_over_mean([[0.0, 0.0]]) == 1.0


def test_an_even_split_is_balanced_for_the_layers_and_a_lone_image_is_not():
    """The figures of the module docstring on Qwen2.5-VL's default config: a 32k-token row split evenly is
    balanced within 1e-4 at cp 2 and 4 whatever its images (the layers' work), while ring attention's causal
    share would make the last rank's layer work at least 1.1x the mean; one image the tower cannot divide makes
    its rank the costliest (about 1.1x at cp 2, 1.3x at cp 4)."""
    from transformers import AutoConfig

    from mpipe_hf.train.context_parallel_balance import cost_weights
    weights = cost_weights(AutoConfig.for_model("qwen2_5_vl"))
    assert 0 < weights.pair < 1e-4 and 0.05 < weights.patch < 1
    for cp, lone in ((2, 1.11), (4, 1.33)):
        layers = costliest_over_mean([rank_work(MicroWork((32769,)), cp, weights)])
        assert 1 <= layers < 1 + 1e-4
        frames = costliest_over_mean([rank_work(MicroWork((32768,), items=(1920,) * 16), cp, weights)])
        assert frames == pytest.approx(1.0)
        ring = [n + weights.pair * p for n, p in zip(even_lengths(32768, cp), ring_pairs(even_lengths(32768, cp)))]
        assert max(ring) / (sum(ring) / cp) > 1.1
        image = costliest_over_mean([rank_work(MicroWork((32768,), items=(30720,)), cp, weights)])
        assert image == pytest.approx(lone, abs=0.01)


def test_a_run_s_steps_and_the_data_check_group_the_rows_as_micro_batches():
    """:class:`Balance` reads each step's micros from the plan; :func:`data_balance` groups rows in file order by
    ``micro_batch_size`` or, packed, up to the token budget (rows cut to the row length)."""
    from mpipe_hf.train.context_parallel_balance import Balance, data_balance
    weights = CostWeights(pair=0.0, patch=1.0)
    dataset = SimpleNamespace(num_tokens=[8, 8, 8, 8], image_tokens=[6, 0, 0, 0], video_tokens=[])
    plan = SimpleNamespace(rows=lambda step, m: [[0], [1, 2], [3], []][2 * step + m])
    balance = Balance(plan, dataset, weights, 2, 2, packed=False, row_length=100)
    assert balance.step(0) == pytest.approx((10 + 8) / (7 + 8)) and balance.step(1) == pytest.approx(1.0)
    data = SimpleNamespace(row_length=8, packing=False, micro_batch_size=2, token_budget=16)
    assert data_balance([8, 9, 8, 8], [6, 0, 0, 0], [0, 0, 0, 0], data, weights, 2) == \
        pytest.approx(((14 + 8) / (11 + 8), 14 / 11))
    packed = SimpleNamespace(row_length=8, packing=True, micro_batch_size=1, token_budget=16)
    assert data_balance([8, 8, 8], [0, 0, 6], [0, 0, 0], packed, weights, 2) == \
        pytest.approx(((8 + 4 + 6) / (8 + 7), 10 / 7))


def test_the_progress_line_shows_the_costliest_cp_rank():
    """``cp_max`` in the progress line's fields, after the loss and before the throughput, where the step's row has
    the figure (cp > 1), and not at cp 1."""
    from mpipe_hf.train.report import progress_fields
    stats = SimpleNamespace(loss=1.5, aux_loss=None, bubble=0.25)
    row = {"tokens_per_s": 100.0}
    assert list(progress_fields(stats, row)) == ["loss", "tok_s", "bubble"]
    fields = progress_fields(stats, {**row, "cp_costliest_over_mean": 1.234})
    assert list(fields) == ["loss", "cp_max", "tok_s", "bubble"] and fields["cp_max"] == "1.23"


def test_check_data_prints_the_costliest_cp_rank(demo, tmp_path, capsys, monkeypatch):
    """``mpipe-hf check-data`` on the demo's rows at ``parallel.cp_size: 2`` prints the costliest rank over the
    mean (at least 1) in its summary; at cp_size 1 it prints no such line."""
    import datasets
    import yaml

    from mpipe_hf.train.data_check import check_data_main
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    for cp in (2, 1):
        path = tmp_path / f"recipe{cp}.yaml"
        path.write_text(yaml.safe_dump({
            "model": os.path.join(demo, "model"), "data": {"path": os.path.join(demo, "data", "train.jsonl")},
            "parallel": {"pp_size": 2, "num_micro": 2, "cp_size": cp},
            "train": {"output_dir": str(tmp_path / "out")}}))
        check_data_main(str(path), decode=False, num_proc=1, clean=None)
        text = capsys.readouterr().out
        line = [t for t in text.splitlines() if t.startswith("context parallelism (cp_size 2)")]
        if cp == 1:
            assert not line, text
            continue
        assert len(line) == 1, text
        figure = float(line[0].split("train.jsonl ")[1].split(" ")[0])
        assert figure >= 1.0 and "worst micro-batch" in line[0]
