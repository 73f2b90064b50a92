"""The trace analysis (hybridcomm/bench/phases.py) on synthetic records with known phases,
clock rate, timer offset and link latency: what it prints from a GPU run must be right."""

import numpy as np
import pytest

from hybridcomm import trace
from hybridcomm.bench import phases

RATE_GHZ = 1.9
# ns after kernel entry at which block 0's thread 0 passes each event (0: not passed)
STAMPS = {"entry": 0, "ready": 400, "arrived": 900, "sent": 1300, "refilled": 0, "wait_begin": 1350,
          "wait_end": 2600, "end_begin": 2800, "arrivals": 3000, "counted": 3100, "exit": 3250}


def records(calls, start_ns, offset_ns=0, sent_shift=0, wait_end=None):
    """`calls` back-to-back calls of one rank; `offset_ns` added to its global timer."""
    rec = np.zeros(calls, trace.RECORD)
    rec["flag"] = np.arange(1, calls + 1)
    rec["blocks"] = 1
    for k in range(calls):
        t0 = start_ns[k]
        for name, dt in STAMPS.items():
            if name == "entry" or dt:
                e = trace.EVENTS.index(name)
                t = t0 + dt + (sent_shift if name == "sent" else 0)
                if name == "wait_end" and wait_end is not None:
                    t = wait_end[k]
                rec["ns"][k, e] = t + offset_ns
                rec["cycles"][k, e] = round(t * RATE_GHZ)
        rec["last_ns"][k] = t0 + STAMPS["exit"] + 100 + offset_ns
        rec["last_cycles"][k] = round((t0 + STAMPS["exit"] + 100) * RATE_GHZ)
    return rec


def test_phases_are_the_differences_of_the_stamps_in_ns():
    starts = 10_000 + 4_000 * np.arange(phases.CALLS)
    rec = records(phases.CALLS, starts)
    assert phases.clock_rate_ghz(rec) == pytest.approx(RATE_GHZ, rel=1e-3)
    spans = {k: float(np.median(v)) for k, v in phases.phase_spans(rec, RATE_GHZ).items()}
    assert spans["pdl wait (entry -> ready)"] == pytest.approx(400, abs=1)
    assert spans["store (own data to peers)"] == pytest.approx(400, abs=1)
    assert np.isnan(spans["refill (Lamport)"])  # not stamped by this kernel
    # the phase after a missing stamp starts at the latest stamp before it
    assert spans["until first poll"] == pytest.approx(50, abs=1)
    assert spans["wait for peers' data"] == pytest.approx(1250, abs=1)
    total = sum(v for k, v in spans.items() if not np.isnan(v) and not k.startswith("pdl"))
    assert total == pytest.approx(STAMPS["exit"] - STAMPS["ready"], abs=2)
    glob = phases.global_phases(rec)
    # back to back every 4000 ns; the last block ends 3350 ns after entry
    assert np.nanmedian(glob["entry - previous kernel's end (<0: PDL overlap)"]) == pytest.approx(650)
    assert np.nanmedian(glob["call period: ready -> next call's ready"]) == pytest.approx(4000)
    assert np.isnan(glob["entry - previous kernel's end (<0: PDL overlap)"][0])


def test_cross_rank_offset_latency_and_skew_are_recovered():
    calls, latency, offset, late = phases.CALLS, 700, 123_456, 300
    rng = np.random.default_rng(0)
    starts0 = 50_000 + 5_000 * np.arange(calls)
    starts1 = starts0 + late  # rank 1 starts `late` ns after rank 0 (true time)
    # data arrives one latency after the sender's stores, or when the receiver polls, if later;
    # some calls see extra delay (only the minimum matters)
    sent0, sent1 = starts0 + STAMPS["sent"], starts1 + STAMPS["sent"]
    extra = rng.integers(0, 400, calls)
    extra[::7] = 0
    got1 = np.maximum(sent0 + latency + extra, starts1 + STAMPS["wait_begin"])
    got0 = np.maximum(sent1 + latency + extra, starts0 + STAMPS["wait_begin"])
    r0 = records(calls, starts0, wait_end=got0)
    r1 = records(calls, starts1, offset_ns=offset, wait_end=got1)
    got_offset, got_latency = phases.clock_offset_ns(r0, r1)
    assert got_offset == pytest.approx(offset, abs=1)
    assert got_latency == pytest.approx(latency, abs=1)
    case = phases.TraceCase("synthetic", "all_reduce", "one_shot", 2048)
    results = [{"records": r, "us_per_call": 5.0, "backend": "nvlink", "algorithm": "one_shot"} for r in (r0, r1)]
    a = phases.analyse(case, results)
    assert a["cross_rank"][0]["ready_minus_rank0_median_ns"] == pytest.approx(late, abs=1)
    text = phases.format_report([a])
    assert "wait for peers' data" in text and "rank 1 vs 0" in text
