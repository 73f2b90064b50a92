"""`hybridcomm tune` and table files: rules from synthetic timings with known winners, the
noise tolerance, transitions over several layouts, the file round trip into a Communicator,
clear errors for bad files, and the packaged tables matching the committed results."""

import json
import random
from pathlib import Path

import pytest

from hybridcomm import algorithms, table_file, tune
from hybridcomm.algorithms import KiB, MiB, Rule
from hybridcomm.cli import main

REPO = Path(__file__).resolve().parents[1]
SIZES = [1 << k for k in range(11, 25)]  # 2 KiB .. 16 MiB
LAMPORT = "one_shot_lamport"
# Columns no table rule can name: faster than every candidate, and never chosen.
NOT_CANDIDATES = ("hybridcomm", "nccl_symm", "symm_one_shot", "hc_unfused")


def _ops_results(winners: dict[str, list[str]], rng: random.Random, world: int = 4) -> dict:
    """bench ops JSON: at each size the named column is fastest, every other candidate 20-200%
    slower, the non-candidates twice as fast as the winner."""
    records = []
    for op, per_size in winners.items():
        columns = [f"hc_{a.name}" for a in tune.OPS[op].algorithms] + ["nccl"]
        for nbytes, win in zip(SIZES, per_size):
            base = rng.uniform(4, 400)
            for impl in columns:
                us = base if impl == win else base * (1.2 + rng.uniform(0, 2))
                records.append({"op": op, "bytes": nbytes, "impl": impl, "us": us})
            records += [{"op": op, "bytes": nbytes, "impl": impl, "us": base / 2} for impl in NOT_CANDIDATES]
    rng.shuffle(records)
    return {"environment": {"gpu": "Test GPU", "date": "2026-01-01"}, "world_size": world, "records": records}


@pytest.mark.parametrize("seed", range(4))
def test_tune_finds_the_known_winners_and_merges_them_into_rules(seed):
    rng = random.Random(seed)
    winners = {"all_reduce": ["hc_one_shot"] * 5 + [f"hc_{LAMPORT}"] * 4 + ["hc_two_shot_bulk"] * 3 + ["nccl"] * 2,
               "all_gather_v": [f"hc_{LAMPORT}"] * 14,
               "reduce_scatter_v": ["nccl"] + ["hc_one_shot"] * 13}
    doc = tune.tune([("synthetic.json", _ops_results(winners, rng))])
    rules = table_file.parse(doc, "synthetic")
    assert rules["all_reduce"] == (Rule(32 * KiB, "nvlink", "one_shot"), Rule(512 * KiB, "nvlink", LAMPORT),
                                   Rule(4 * MiB, "nvlink", "two_shot_bulk"), Rule(None, "nccl", "nccl"))
    # Past the largest measured size NCCL runs, whoever won there.
    assert rules["all_gather_v"] == (Rule(16 * MiB, "nvlink", LAMPORT), Rule(None, "nccl", "nccl"))
    assert rules["reduce_scatter_v"] == (Rule(2 * KiB, "nccl", "nccl"), Rule(16 * MiB, "nvlink", "one_shot"),
                                         Rule(None, "nccl", "nccl"))
    assert set(doc["not_measured"]) == set(tune.OPS) - set(winners)
    assert doc["measured_on"]["gpu"] == "Test GPU" and doc["measured_on"]["world_size"] == 4
    chosen = [e["chosen"] for e in doc["evidence"]["all_reduce"]]
    assert chosen == [f"nvlink/{w[3:]}" if w != "nccl" else "nccl/nccl" for w in winners["all_reduce"]]


def _near_ties(gap: float) -> dict:
    """one_shot fastest at every size but one, where Lamport is `gap` faster."""
    records = []
    for i, nbytes in enumerate(SIZES[:6]):
        one, lamport = (10.0, 10.0 * (1 - gap)) if i == 3 else (10.0, 20.0)
        records += [{"op": "all_reduce", "bytes": nbytes, "impl": "hc_one_shot", "us": one},
                    {"op": "all_reduce", "bytes": nbytes, "impl": f"hc_{LAMPORT}", "us": lamport}]
    return {"environment": {"gpu": "Test GPU"}, "world_size": 2, "records": records}


def test_a_difference_within_the_tolerance_adds_no_rule():
    rules = table_file.parse(tune.tune([("x", _near_ties(0.03))], tolerance=0.05), "x")["all_reduce"]
    assert rules == (Rule(SIZES[5], "nvlink", "one_shot"), Rule(None, "nccl", "nccl"))
    rules = table_file.parse(tune.tune([("x", _near_ties(0.03))], tolerance=0.01), "x")["all_reduce"]
    assert rules == (Rule(SIZES[2], "nvlink", "one_shot"), Rule(SIZES[3], "nvlink", LAMPORT),
                     Rule(SIZES[5], "nvlink", "one_shot"), Rule(None, "nccl", "nccl"))


def test_an_exact_tie_goes_to_the_simpler_algorithm():
    # one_shot and Lamport 2% apart, each ahead at every other size: one rule, the registry's first.
    records = []
    for i, nbytes in enumerate(SIZES[:4]):
        fast, slow = ("hc_one_shot", f"hc_{LAMPORT}")[:: 1 if i % 2 else -1]
        records += [{"op": "all_gather_v", "bytes": nbytes, "impl": fast, "us": 10.0},
                    {"op": "all_gather_v", "bytes": nbytes, "impl": slow, "us": 10.2}]
    doc = tune.tune([("x", {"environment": {}, "world_size": 2, "records": records})])
    assert table_file.parse(doc, "x")["all_gather_v"][0] == Rule(SIZES[3], "nvlink", "one_shot")


def _transitions_results(rng: random.Random) -> dict:
    """bench transitions JSON on dp2xtp2 and dp4 (hidden 4096, bf16: 8 KiB per token).
    gather_tokens: one_shot to 64 KiB, Lamport above, two_step at the largest size (on dp2xtp2
    in its older column name, hc_unfused: a candidate only if tune reads it as two_step, since
    a size counts only candidates that ran on every layout); scatter_tokens: one_shot, NCCL at
    the largest size; gather with norm: fused, NCCL at the largest. Imbalanced cases say
    otherwise (and are not used); two_shot is fastest of all on dp2xtp2 at 256 KiB but did not
    run on dp4 there (so it is no candidate at that size). On dp4 (attn_tp = 1) tune reads
    two_step's time as Lamport's, the kernel it runs there (the table's all_gather_v rule)."""
    records = []

    def add(layout, op, case, tokens, times):
        records.extend({"layout": layout, "op": op, "case": case, "tokens_per_dp": tokens, "impl": k, "us": t}
                       for k, t in times.items())

    for layout, dp in (("dp2xtp2", 2), ("dp4", 4)):
        for t in (1, 2, 4, 8, 16, 32)[: 8 - dp]:  # both to 512 KiB
            nbytes, base = dp * t * 8 * KiB, rng.uniform(5, 50)
            slow = lambda: base * rng.uniform(1.3, 3)  # noqa: E731
            biggest = nbytes == 512 * KiB
            gather = {"hc_one_shot": base if nbytes <= 64 * KiB else slow(), f"hc_{LAMPORT}":
                      slow() if nbytes <= 64 * KiB else base, "hc_two_shot": slow(), "nccl": slow(),
                      "hc_unfused" if layout == "dp2xtp2" else "hc_two_step": base / 2 if biggest else slow(),
                      "nccl_symm": base / 2,
                      "hc_norm": slow() if biggest else base, "nccl_norm": base if biggest else slow()}
            if nbytes == 256 * KiB:
                if layout == "dp2xtp2":
                    gather["hc_two_shot"] = base / 3
                else:
                    del gather["hc_two_shot"]
            add(layout, "gather_tokens", "balanced", [t] * dp, gather)
            add(layout, "scatter_tokens", "balanced", [t] * dp,
                {"hc_one_shot": slow() if biggest else base, "hc_two_shot": slow(), "nccl": base if biggest else slow()})
        add(layout, "gather_tokens", "imbalanced", [64] + [1] * (dp - 1), {"nccl": 1.0, "hc_one_shot": 100.0})
    return {"environment": {"gpu": "Test GPU"}, "hidden": 4096, "dtype": "torch.bfloat16", "records": records}


@pytest.mark.parametrize("seed", range(3))
def test_transitions_over_several_layouts(seed):
    doc = tune.tune([("tr.json", _transitions_results(random.Random(seed)))])
    rules = table_file.parse(doc, "tr")
    assert rules["gather_tokens"] == (Rule(64 * KiB, "nvlink", "one_shot"), Rule(256 * KiB, "nvlink", LAMPORT),
                                      Rule(512 * KiB, "nvlink", "two_step"), Rule(None, "nccl", "nccl"))
    assert rules["scatter_tokens"] == (Rule(256 * KiB, "nvlink", "one_shot"), Rule(None, "nccl", "nccl"))
    assert rules["gather_tokens_norm"] == (Rule(256 * KiB, "nvlink", "fused"), Rule(None, "nccl", "nccl"))
    # At 256 KiB dp2xtp2's fastest, two_shot, did not run on dp4: so the op's rules lose there by
    # more than the tolerance, and dp2xtp2 gets rules of its own, from its timings alone.
    assert [key for key in rules if "@" in key] == ["gather_tokens@dp2xtp2"]
    assert rules["gather_tokens@dp2xtp2"] == (Rule(64 * KiB, "nvlink", "one_shot"), Rule(128 * KiB, "nvlink", LAMPORT),
                                              Rule(256 * KiB, "nvlink", "two_shot"),
                                              Rule(512 * KiB, "nvlink", "two_step"), Rule(None, "nccl", "nccl"))
    assert [e["measured_in"] for e in doc["evidence"]["gather_tokens@dp2xtp2"]] == [["tr.json:dp2xtp2"]] * 6
    sizes = [e["bytes"] for e in doc["evidence"]["gather_tokens"]]
    assert sizes == [16 * KiB * 2 ** i for i in range(6)]  # 16 KiB (dp2xtp2, 1 token) .. 512 KiB
    at_32k = doc["evidence"]["gather_tokens"][1]
    assert at_32k["measured_in"] == ["tr.json:dp2xtp2", "tr.json:dp4"]
    assert doc["measured_on"]["world_size"] == 4


def test_a_layout_s_own_rules_go_on_with_the_op_s_past_its_largest_measured_size():
    """tp4 (to 512 KiB) and dp2xtp2 (to 4 MiB). scatter_tokens: one_shot fastest, but two_step 30%
    faster on tp4 from 256 KiB and 2x slower on dp2xtp2: the op's rules (one_shot, by the
    geometric mean) lose on tp4, whose own rules run two_step to 512 KiB and then the op's.
    gather_tokens: Lamport 4% ahead on tp4 and 4% behind on dp2xtp2: within the tolerance, so
    no rules of its own anywhere."""
    rng, records = random.Random(7), []
    for layout, dp, counts in (("tp4", 1, range(7)), ("dp2xtp2", 2, range(9))):
        for t in (2 ** i for i in counts):
            nbytes, base = dp * t * 8 * KiB, rng.uniform(5, 50)
            step = base * (0.7 if layout == "tp4" and nbytes >= 256 * KiB else 2)
            lamport = base * (0.96 if layout == "tp4" else 1.04)
            times = {"scatter_tokens": {"hc_one_shot": base, "hc_two_step": step, "nccl": base * 3},
                     "gather_tokens": {"hc_one_shot": base, f"hc_{LAMPORT}": lamport, "nccl": base * 3}}
            records += [{"layout": layout, "op": op, "case": "balanced", "tokens_per_dp": [t] * dp, "impl": impl,
                         "us": us} for op, columns in times.items() for impl, us in columns.items()]
    results = {"environment": {"gpu": "Test GPU"}, "hidden": 4096, "dtype": "torch.bfloat16", "records": records}
    rules = table_file.parse(tune.tune([("tr.json", results)]), "tr")
    assert rules["scatter_tokens"] == (Rule(4 * MiB, "nvlink", "one_shot"), Rule(None, "nccl", "nccl"))
    assert rules["scatter_tokens@tp4"] == (Rule(128 * KiB, "nvlink", "one_shot"), Rule(512 * KiB, "nvlink", "two_step"),
                                           Rule(4 * MiB, "nvlink", "one_shot"), Rule(None, "nccl", "nccl"))
    assert rules["gather_tokens"] == (Rule(4 * MiB, "nvlink", "one_shot"), Rule(None, "nccl", "nccl"))
    assert sorted(key for key in rules if "@" in key) == ["scatter_tokens@tp4"]


def test_where_attn_tp_is_1_a_candidate_that_runs_another_s_kernel_reads_its_time():
    """dp4: gather_tokens' two_shot runs one_shot's kernel (all_gather_v's one-shot), two_step the
    kernel of all_gather_v's rule at that size (here Lamport to 128 KiB, one_shot above); dp2xtp2
    keeps every timing."""
    results = _transitions_results(random.Random(0))
    gather = tune.samples(results, "tr.json")["gather_tokens"]
    timed = {nbytes: {g: dict(us) for g, us in groups.items()} for nbytes, groups in gather.items()}
    rules = {"all_gather_v": (Rule(128 * KiB, "nvlink", LAMPORT), Rule(None, "nvlink", "one_shot"))}
    tune.same_kernel_times("gather_tokens", gather, rules)
    ours = lambda a: ("nvlink", a)  # noqa: E731
    for nbytes, groups in gather.items():
        for (where, layout), us in groups.items():
            before = timed[nbytes][(where, layout)]
            if layout == "dp2xtp2":
                assert us == before
                continue
            step_runs = LAMPORT if nbytes <= 128 * KiB else "one_shot"
            assert us[ours("two_step")] == before[ours(step_runs)]
            assert ours("two_shot") not in before or us[ours("two_shot")] == before[ours("one_shot")]
            assert all(us[c] == before[c] for c in before if c not in (ours("two_step"), ours("two_shot")))

def test_forced_fused_columns_fill_the_norm_rules_and_the_choice_column_stands_in_only_without_them():
    """Results with hc_fused / hc_fused_lamport: fused_lamport fastest to 64 KiB, fused above, and
    hc_norm (the Communicator's choice, fastest of all here) no candidate; without them hc_norm
    is read as fused."""
    rng = random.Random(5)
    records = []
    for layout, dp in (("tp4", 1), ("dp4", 4)):
        for t in (1, 2, 4, 8, 16, 32):
            nbytes, base = dp * t * 8 * KiB, rng.uniform(5, 50)
            lamport_wins = nbytes <= 64 * KiB
            times = {"hc_fused": base * 1.5 if lamport_wins else base, "hc_fused_lamport": base if lamport_wins
                     else base * 1.5, "hc_norm": base / 2, "nccl_norm": base * 3}
            records += [{"layout": layout, "op": "gather_tokens", "case": "balanced", "tokens_per_dp": [t] * dp,
                         "impl": k, "us": v} for k, v in times.items()]
    results = {"environment": {"gpu": "Test GPU"}, "hidden": 4096, "dtype": "torch.bfloat16", "records": records}
    rules = table_file.parse(tune.tune([("tr.json", results)]), "tr")
    assert rules["gather_tokens_norm"] == (Rule(64 * KiB, "nvlink", "fused_lamport"), Rule(1 * MiB, "nvlink", "fused"),
                                           Rule(None, "nccl", "nccl"))
    results["records"] = [r for r in records if r["impl"] in ("hc_norm", "nccl_norm")]
    rules = table_file.parse(tune.tune([("tr.json", results)]), "tr")
    assert rules["gather_tokens_norm"] == (Rule(1 * MiB, "nvlink", "fused"), Rule(None, "nccl", "nccl"))


FP8_ROW = 4096 + 4  # fp8 hidden 4096: data and the token's fp32 scale (quant.formats)


def _quant_results(rng: random.Random) -> dict:
    """bench quant JSON (fp8, hidden 4096) of dp2 and tp2: on tp2 quant_local fastest to 128 rows,
    quant above; dp2 times quant and quant_lamport only (one hop and local run quant's kernel
    there), quant fastest; nccl_q slower everywhere; the baselines tune cannot route to faster."""
    records = []
    for layout, groups in (("dp2", 2), ("tp2", 1)):
        for tokens in (1, 16, 64, 128, 256, 512, 1024):
            rows, base = tokens * groups, rng.uniform(5, 50)
            win = "hc_quant_local" if layout == "tp2" and rows <= 128 else "hc_quant"
            tp_only = ["hc_quant_one_hop", "hc_quant_local"] if layout == "tp2" else []
            ours = ["hc_quant", "hc_quant_lamport"] + tp_only
            us = {impl: base if impl == win else base * (1.2 + rng.uniform(0, 1)) for impl in ours}
            us.update(nccl_q=base * 3, hybridcomm=base / 2, hc_bf16=base / 2, nccl_symm_q=base / 2, nccl_ag_only=1.0)
            for case in ("balanced", "imbalanced"):  # (the imbalanced ones are not evidence)
                records += [{"layout": layout, "format": "fp8", "hidden": 4096, "case": case,
                             "tokens_per_dp": [tokens] * groups, "impl": impl,
                             "us": t if case == "balanced" else 1.0} for impl, t in us.items()]
    return {"environment": {"gpu": "Test GPU"}, "dtype": "torch.bfloat16", "records": records}


@pytest.mark.parametrize("seed", range(3))
def test_quantized_gathers_from_bench_quant(seed):
    """Message = the gathered quantized bytes; on dp2 (attn_tp = 1) quant_local counts as quant,
    the kernel it runs there, so it stays the choice up to tp2's last win (128 rows, measured on
    both layouts) without a rule of its own at dp2's sizes between. dp2's records fill
    all_gather_v_quant as well (the same kernel on the world group)."""
    doc = tune.tune([("q.json", _quant_results(random.Random(seed)))])
    rules = table_file.parse(doc, "q")
    assert rules["gather_tokens_quant"] == (Rule(128 * FP8_ROW, "nvlink", "quant_local"),
                                            Rule(2048 * FP8_ROW, "nvlink", "quant"), Rule(None, "nccl", "nccl"))
    # dp2's records time all_gather_v_quant's kernels on the world too (tp2's do not): quant throughout.
    assert rules["all_gather_v_quant"] == (Rule(2048 * FP8_ROW, "nvlink", "quant"), Rule(None, "nccl", "nccl"))
    measured = {2 * t * FP8_ROW for t in (1, 16, 64, 128, 256, 512, 1024)}
    assert {e["bytes"] for e in doc["evidence"]["all_gather_v_quant"]} == measured
    assert all(e["measured_in"] == ["q.json:dp2"] for e in doc["evidence"]["all_gather_v_quant"])
    assert "all_gather_v_quant" not in doc["not_measured"]
    at_128 = next(e for e in doc["evidence"]["gather_tokens_quant"] if e["bytes"] == 128 * FP8_ROW)
    assert at_128["measured_in"] == ["q.json:dp2", "q.json:tp2"]


def test_results_of_different_machines_across_nodes_or_without_host_counts_are_refused():
    ops = _ops_results({"all_reduce": ["hc_one_shot"] * 14}, random.Random(0), world=2)
    with pytest.raises(tune.ResultsError, match="different machines.*x2.*x4"):
        tune.tune([("ops.json", ops), ("tr.json", _transitions_results(random.Random(0)))])
    with pytest.raises(tune.ResultsError, match="nodes.json: measured across simulated nodes"):
        tune.tune([("nodes.json", {**ops, "ranks_per_node": 1})])
    cpu = {"environment": {}, "world_size": 2, "records": [{"op": "all_reduce", "bytes": 2048, "impl": "reference",
                                                             "us": 50.0}]}
    with pytest.raises(tune.ResultsError, match="cpu.json: no column the table can name"):
        tune.tune([("cpu.json", cpu)])
    own = _quant_results(random.Random(0))
    own["records"] = [{**r, "counts": "own"} for r in own["records"]]
    with pytest.raises(tune.ResultsError, match="own.json: timed with `bench quant --counts own`"):
        tune.tune([("own.json", own)])
    other = "layer_4xH200.json"  # another benchmark's results
    with pytest.raises(tune.ResultsError, match=f"{other}: not the results of `hybridcomm bench ops`"):
        tune.tune_files([REPO / "results/4xH200" / other])


# -- table files ----------------------------------------------------------------------------
def _doc() -> dict:
    return tune.tune([("s.json", _ops_results({"all_reduce": ["hc_one_shot"] * 7 + ["nccl"] * 7},
                                              random.Random(1)))])


def _communicator_tables(table):
    import torch.distributed as dist

    from hybridcomm import Communicator, Layout

    try:
        comm = Communicator(Layout(dist.get_world_size()), table=table)
    except ValueError as e:
        return str(e)
    return comm.tables


def test_a_written_table_reaches_the_communicator(tmp_path, pool):
    path = table_file.write(_doc(), tmp_path / "t.json")
    expected = {**algorithms.TABLE, "all_reduce": (Rule(128 * KiB, "nvlink", "one_shot"), Rule(None, "nccl", "nccl"))}
    assert table_file.load(path) == expected
    for tables in pool(2).run(_communicator_tables, str(path), timeout=60):
        assert tables == {**algorithms.TABLES, 1: expected}
    for tables in pool(2).run(_communicator_tables, "4xH200", timeout=60):  # a packaged table, by name
        assert tables[1] == table_file.load(table_file.TABLES_DIR / "4xH200.json")
    for error in pool(2).run(_communicator_tables, str(tmp_path / "missing.json"), timeout=60):
        assert "table: " in error and "missing.json" in error and "4xH200" in error


def _break_rules(doc, op, i, **change):
    doc["rules"][op][i].update(change)


BAD = {
    "unknown op": (lambda d: d["rules"].update(frobnicate=d["rules"]["all_reduce"]), "unknown op 'frobnicate'"),
    "unknown algorithm": (lambda d: _break_rules(d, "all_reduce", 0, algorithm="three_shot"),
                          "all_reduce rule 0: unknown algorithm 'three_shot'; all_reduce has ['one_shot'"),
    "unsorted": (lambda d: d["rules"]["all_reduce"].insert(1, {"max_bytes": 2048, "backend": "nccl",
                                                               "algorithm": "nccl"}),
                 "max_bytes must increase from rule to rule; rule 0 has 131072, rule 1 2048"),
    "bounded last rule": (lambda d: _break_rules(d, "all_reduce", 1, max_bytes=1 << 30), "the last rule"),
    "unknown backend": (lambda d: _break_rules(d, "all_reduce", 0, backend="hierarchical"),
                        "unknown backend 'hierarchical'"),
    "nccl's algorithm": (lambda d: _break_rules(d, "all_reduce", 1, algorithm="one_shot"), "backend nccl runs"),
    "text size": (lambda d: _break_rules(d, "all_reduce", 0, max_bytes="128K"), "positive integer or null"),
    "extra key": (lambda d: _break_rules(d, "all_reduce", 0, min_bytes=0), "expected keys max_bytes"),
    "layout of a row op": (lambda d: d["rules"].update({"all_reduce@tp4": d["rules"]["all_reduce"]}),
                           "'all_reduce@tp4': only the transitions (gather_tokens, gather_tokens_norm"),
    "unknown layout": (lambda d: d["rules"].update({"scatter_tokens@tp4x": d["rules"]["all_reduce"]}),
                       "'scatter_tokens@tp4x': expected a layout's attention name after '@'"),
    "layout with MoE": (lambda d: d["rules"].update({"scatter_tokens@tp4,moe_tp2": d["rules"]["all_reduce"]}),
                        "expected a layout's attention name"),
    "layout's rule": (lambda d: d["rules"].update({"scatter_tokens@tp4": [{"max_bytes": None, "backend": "nvlink",
                                                                           "algorithm": "fused"}]}),
                      "scatter_tokens@tp4 rule 0: unknown algorithm 'fused'"),
    "layout's rules alone": (lambda d: d["rules"].update({"gather_tokens@dp4": [{"max_bytes": None, "backend": "nccl",
                                                                                  "algorithm": "nccl"}]}),
                             "'gather_tokens@dp4' needs 'gather_tokens''s own rules too"),
    "no format": (lambda d: d.pop("format"), "hybridcomm-table/1"),
    "no rules": (lambda d: d.pop("rules"), "\"rules\" must map ops"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_table_file_says_what_is_wrong(case, tmp_path):
    doc = _doc()
    breaks, words = BAD[case]
    breaks(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(table_file.TableFileError) as e:
        table_file.load(path)
    assert str(path) in str(e.value) and words in str(e.value), str(e.value)
    with pytest.raises(table_file.TableFileError):
        table_file.write(doc, tmp_path / "never.json")  # write checks too
    assert not (tmp_path / "never.json").exists()


def test_a_file_s_rules_for_an_op_replace_the_built_in_ones_for_every_layout(tmp_path):
    """The file measured scatter_tokens: the built-in table's rules for it on tp4 go too (they
    would otherwise still win there); its rules for one layout apply to that layout."""
    assert "scatter_tokens@tp4" in algorithms.TABLE
    doc = _doc()
    doc["rules"]["scatter_tokens"] = [{"max_bytes": None, "backend": "nvlink", "algorithm": "one_shot"}]
    doc["rules"]["scatter_tokens@dp2xtp2"] = [{"max_bytes": None, "backend": "nvlink", "algorithm": "two_step"}]
    table = table_file.load(table_file.write(doc, tmp_path / "t.json"))
    assert sorted(key for key in table if key.startswith("scatter_tokens")) == ["scatter_tokens",
                                                                                 "scatter_tokens@dp2xtp2"]
    assert table["gather_tokens@dp4"] == algorithms.TABLE["gather_tokens@dp4"]  # not in the file: built-in
    never = lambda algorithm: None  # noqa: E731
    assert algorithms.choose("scatter_tokens", 4 * MiB, never, table, "tp4").algorithm == "one_shot"
    assert algorithms.choose("scatter_tokens", 4 * MiB, never, table, "dp2xtp2").algorithm == "two_step"


def test_a_file_that_is_not_json(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{rules: ")
    with pytest.raises(table_file.TableFileError, match="not JSON"):
        table_file.load(path)


# -- the committed tables -------------------------------------------------------------------
PACKAGED_SOURCES = {"4xH200": ["results/4xH200/ops_4xH200.json", "results/4xH200/transitions_4xH200.json"],
                    "2xH200": ["results/2xH200/ops_2xH200.json", "results/2xH200/transitions_2xH200.json",
                               "results/2xH200/quant_2xH200.json"]}


def test_every_packaged_table_is_generated_from_the_committed_results(monkeypatch):
    assert table_file.packaged() == sorted(PACKAGED_SOURCES)
    monkeypatch.chdir(REPO)  # the files name their sources relative to the repository
    for name, sources in PACKAGED_SOURCES.items():
        committed = json.loads((table_file.TABLES_DIR / f"{name}.json").read_text())
        assert tune.tune_files(sources, committed["method"]["tolerance"]) == committed, \
            f"regenerate it: hybridcomm tune --from {' '.join(sources)} --out src/hybridcomm/tables/{name}.json"
        table_file.load(name)  # and it loads (every rule a registry algorithm, limits increasing)


def test_the_built_in_table_is_the_packaged_4xH200_one_where_that_was_measured():
    """algorithms.TABLE states the measured rules by hand (with why); they must be the data's."""
    doc = json.loads((table_file.TABLES_DIR / "4xH200.json").read_text())
    measured = table_file.parse(doc, "4xH200.json")
    for op, rules in measured.items():
        assert algorithms.TABLE[op] == rules, f"{op}: algorithms.TABLE differs from tables/4xH200.json"


@pytest.mark.parametrize("ranks, gpu, expected", [(2, "NVIDIA H200", "2xH200"), (4, "NVIDIA H200", "4xH200"),
                                                   (8, "NVIDIA H200", None), (2, "NVIDIA H100 80GB HBM3", None),
                                                   (2, "", None)])
def test_a_machine_gets_the_table_measured_on_its_shape(ranks, gpu, expected):
    """Communicator's default on CUDA: the packaged table named after GPUs per node and GPU."""
    assert table_file.for_machine(ranks, gpu) == expected


def test_tune_from_files_on_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "table.json"
    assert main(["tune", "--from", *PACKAGED_SOURCES["4xH200"], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "NVIDIA H200 x4" in printed and "(= built-in)" in printed  # the built-in table is this data
    assert table_file.load(out) == table_file.load("4xH200")
    assert main(["tune", "--from", str(out)]) == 2  # a table is not a results file
    assert "not the results of `hybridcomm bench ops`" in capsys.readouterr().err


def test_measuring_runs_the_benchmarks_and_keeps_their_results(tmp_path, capsys, monkeypatch):
    """The GPU path's plumbing, with the benchmarks replaced by the committed 2xH200 results
    (the measurement itself needs GPUs: tests/test_gpu.py does not time, the lead's run does)."""
    import torch

    from hybridcomm.bench import ops as bench_ops, quant as bench_quant, transitions as bench_transitions

    calls = []
    kinds = ("ops", "transitions", "quant")
    committed = {kind: json.loads((REPO / f"results/2xH200/{kind}_2xH200.json").read_text()) for kind in kinds}

    def fake_ops(world, device, sizes):
        calls.append(("ops", world, device, sizes))
        return committed["ops"]

    def fake_transitions(layouts, world):
        calls.append(("transitions", world, layouts))
        return committed["transitions"]

    def fake_quant(layouts, formats, hiddens, tokens, world):
        calls.append(("quant", world, layouts, formats, hiddens, tokens))
        return committed["quant"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(bench_ops, "bench_ops", fake_ops)
    monkeypatch.setattr(bench_transitions, "bench_transitions", fake_transitions)
    monkeypatch.setattr(bench_quant, "bench_quant", fake_quant)
    out = tmp_path / "table.json"
    assert main(["tune", "--sizes", "2K,1M", "--out", str(out)]) == 0, capsys.readouterr().err
    assert calls == [("ops", 2, "cuda", [2048, 1 << 20]), ("transitions", 2, ["dp2", "tp2"]),
                     ("quant", 2, ["dp2", "tp2"], ["fp8", "fp8_block128", "nvfp4"], [4096, 7168], tune.QUANT_TOKENS)]
    doc = json.loads(out.read_text())
    assert [s["file"] for s in doc["measured_on"]["sources"]] == [str(tmp_path / f"table_{kind}.json")
                                                                  for kind in kinds]
    for kind in kinds:
        assert json.loads((tmp_path / f"table_{kind}.json").read_text()) == committed[kind]
        assert (tmp_path / f"table_{kind}.md").exists()
    assert table_file.load(out) == table_file.load("2xH200")
