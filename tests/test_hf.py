"""hybridcomm.hf: transformers MoE models (Qwen3-MoE, Mixtral, DeepSeek-V3 with MLA) as DP
attention x EP MoE on 4 gloo ranks, logits of every DP group's sequences against the
unmodified single-process model (fp32), prefill and decode steps with uneven groups and a
group with no sequences."""

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("transformers")

import hybridcomm as hc  # noqa: E402
from hybridcomm import hf  # noqa: E402
from hybridcomm.hf import check, configs  # noqa: E402
from hybridcomm.hf.check import count_region_calls  # noqa: E402

FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3"]
# the tiny config of every family, and DeepSeek-V3 with every feature of the real one (hf/configs.py)
CONFIGS = [f"{f}-tiny" for f in FAMILIES] + ["deepseek_v3-featured"]
# (name, attn_tp, moe_tp): every kind of world-4 layout
LAYOUTS = [("dp4", 1, 1), ("dp2xtp2", 2, 1), ("tp4", 4, 1), ("dp4,moe_tp2", 1, 2), ("dp2xtp2,moe_tp2", 2, 2)]
SEQUENCES = {1: [3], 2: [3, 1], 4: [2, 0, 3, 1], 8: [2, 0, 3, 1, 1, 0, 2, 1]}  # per DP group: uneven, empty ones


def _decode_against_reference(name: str, attn_tp: int, moe_tp: int, device_counts: bool = False,
                              experts: str | None = None, compiled: bool = False, config_changes=()) -> dict:
    layout = hc.Layout(dist.get_world_size(), attn_tp=attn_tp, moe_tp=moe_tp)
    comm = hc.Communicator(layout)
    config = configs.make(name, **dict(config_changes))
    model = hf.from_config(config, comm, seed=7)
    if experts is not None:
        model.model.set_experts_implementation(experts)
    region_calls = count_region_calls(model.compile()) if compiled else []
    counts = SEQUENCES[layout.attn_dp]
    dp = layout.coords(comm.rank).attn_dp_rank
    prompts = check.dp_prompts(config.vocab_size, counts, 5, dp)
    decoder = hf.Decoder(model, slots=max(counts), max_len=12, graphs=False, device_counts=device_counts)
    fed, logits = check.decode(decoder, prompts, check.pause_schedule(counts, 4))
    result = check.compare(hf.reference_model(config, seed=7), prompts, fed, logits)
    result["compiled_calls"] = len(region_calls)
    return result


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=[name for name, _, _ in LAYOUTS])
def test_logits_match_single_process(pool, config, layout):
    _, attn_tp, moe_tp = layout
    results = pool(4).run(_decode_against_reference, config, attn_tp, moe_tp, timeout=300)
    for rank, r in enumerate(results):
        assert r["max_rel_error"] < 1e-5, (rank, r)
        assert r["top1_agreement"] == 1.0, (rank, r)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[4]], ids=[LAYOUTS[0][0], LAYOUTS[4][0]])
def test_graph_path_with_device_counts(pool, config, layout):
    """The CUDA-graph step's code (bucket-sized static buffers, filler rows, counts in an int32
    tensor, capacity-sized transitions), run eagerly on CPU."""
    _, attn_tp, moe_tp = layout
    for r in pool(4).run(_decode_against_reference, config, attn_tp, moe_tp, True, timeout=300):
        assert r["max_rel_error"] < 1e-5 and r["top1_agreement"] == 1.0, r


def test_batched_mm_experts(pool):
    """batched_mm, what GPU runs use for dtypes other than bf16, skips the routes of experts a
    rank does not own."""
    for r in pool(4).run(_decode_against_reference, "deepseek_v3-featured", 2, 2, True, "batched_mm",
                         timeout=300):
        assert r["max_rel_error"] < 1e-5 and r["top1_agreement"] == 1.0, r


@pytest.mark.parametrize("name, attn_tp", [("mixtral-tiny", 1), ("deepseek_v3-featured", 2)])
def test_eight_ranks(pool, name, attn_tp):
    """World 8, the common node: DP8 (Mixtral's 8 experts, one a rank) and DP4xTP2 (the featured
    DeepSeek-V3: group-limited routing over 32 experts, 4 a rank)."""
    for r in pool(8).run(_decode_against_reference, name, attn_tp, 1, True, timeout=600):
        assert r["max_rel_error"] < 1e-5 and r["top1_agreement"] == 1.0, r


def _one_expert_per_rank(experts: str | None) -> dict:
    """_decode_against_reference with 4 experts over moe_ep 4, counting the torch.histc calls
    whose range is min = max (histc then reads the data's range: a host sync on CUDA, which
    fails inside graph capture)."""
    histc, degenerate = torch.histc, []

    def watched(x, bins=100, min=0, max=0, **kw):
        if min == max:
            degenerate.append((bins, min, max))
        return histc(x, bins=bins, min=min, max=max, **kw)

    torch.histc = watched
    try:
        result = _decode_against_reference("mixtral-tiny", 1, 1, True, experts, False, [("num_local_experts", 4)])
    finally:
        torch.histc = histc
    return {**result, "degenerate_histc": len(degenerate)}


@pytest.mark.parametrize("experts", [None, "grouped_mm", "batched_mm"])
def test_one_expert_per_rank(pool, experts):
    """Each rank's experts module holds one expert, and a second group that no route names
    (hf/build.py, _second_expert_group), under each implementation."""
    for r in pool(4).run(_one_expert_per_rank, experts, timeout=300):
        assert r["max_rel_error"] < 1e-5 and r["top1_agreement"] == 1.0, r
        assert r["degenerate_histc"] == 0, r


@pytest.mark.parametrize("device_counts", [False, True], ids=["host_counts", "device_counts"])
def test_compiled_regions_match_single_process(pool, device_counts):
    """ParallelCausalLM.compile(): decode steps through torch.compile'd attention and MoE
    regions (CPU: inductor's C++ code) give the single-process model's logits."""
    for r in pool(4).run(_decode_against_reference, "qwen3_moe-tiny", 2, 1, device_counts, None, True,
                         timeout=600):
        assert r["max_rel_error"] < 1e-5 and r["top1_agreement"] == 1.0, r
        assert r["compiled_calls"] >= 2 * 2, r  # both regions of both layers ran compiled


def _parallelize_materialised_model() -> float:
    """parallelize() of a materialised transformers model copies only this rank's shard."""
    comm = hc.Communicator(hc.Layout(dist.get_world_size(), attn_tp=2))
    config = configs.make("qwen3_moe-tiny")
    full = hf.reference_model(config, seed=3)
    model = hf.parallelize(full, comm)
    n_local = model.model.model.layers[0].mlp.experts.gate_up_proj.shape[0]
    assert n_local == config.num_experts // 4
    prompts = check.dp_prompts(config.vocab_size, [2, 2], 4, model.comm.layout.coords(comm.rank).attn_dp_rank)
    fed, logits = check.decode(hf.Decoder(model, slots=2, max_len=8), prompts, [[2, 2], [1, 2]])
    return check.compare(full, prompts, fed, logits)["max_rel_error"]


def test_parallelize_a_materialised_model(pool):
    assert max(pool(4).run(_parallelize_materialised_model)) < 1e-5


def _steps_from_own_counts() -> float:
    """Eager steps given no counts exchange each DP group's own count (hc.Counts) themselves."""
    comm = hc.Communicator(hc.Layout(dist.get_world_size()))
    config = configs.make("mixtral-tiny")
    decoder = hf.Decoder(hf.from_config(config, comm, seed=2), slots=2, max_len=8)
    counts = [2, 1, 0, 2]
    prompts = check.dp_prompts(config.vocab_size, counts, 3, comm.rank)
    logits = [decoder.prefill(prompts)]
    fed = [[] for _ in range(counts[comm.rank])]
    for _ in range(2):
        tokens = logits[-1][:, -1].argmax(-1)
        for s, t in enumerate(tokens.tolist()):
            fed[s].append(t)
        logits.append(decoder.step(tokens)[:, None])
    ours = [torch.cat([step[s] for step in logits]) for s in range(counts[comm.rank])]
    return check.compare(hf.reference_model(config, seed=2), prompts, fed, ours)["max_rel_error"]


def test_steps_from_own_counts(pool):
    assert max(pool(4).run(_steps_from_own_counts)) < 1e-5


def _from_checkpoint(path: str) -> float:
    comm = hc.Communicator(hc.Layout(dist.get_world_size()))
    model = hf.from_pretrained(path, comm, dtype=torch.float32)
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = check.dp_prompts(full.config.vocab_size, [1] * 4, 4, comm.rank)
    fed, logits = check.decode(hf.Decoder(model, slots=1, max_len=8), prompts, [[1] * 4] * 2)
    return check.compare(full, prompts, fed, logits)["max_rel_error"]


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
def test_from_a_local_checkpoint(pool, tmp_path, family):
    """A checkpoint saved by transformers (per-expert tensors on disk, Mixtral's renamed
    modules) loads shard by shard and matches transformers' own from_pretrained."""
    hf.reference_model(configs.make(f"{family}-tiny"), seed=5).save_pretrained(tmp_path)
    assert max(pool(4).run(_from_checkpoint, str(tmp_path))) < 1e-5


def test_unsupported_architecture_names_what_is_missing():
    from transformers import LlamaConfig

    with pytest.raises(hf.UnsupportedModel, match="'llama' is not supported"):
        hf.family_of(LlamaConfig())


def test_missing_module_is_named():
    from hybridcomm.hf.build import check_structure, meta_model
    from transformers import Qwen3MoeForCausalLM

    model = meta_model(Qwen3MoeForCausalLM, configs.make("qwen3_moe-tiny"))
    del model.model.layers[1].mlp.gate
    with pytest.raises(hf.UnsupportedModel, match=r"model\.layers\.1\.mlp\.gate"):
        check_structure(model, hf.FAMILIES["qwen3_moe"])


def test_layout_that_does_not_divide_the_heads():
    from hybridcomm.hf.plan import RankPlan

    config = configs.make("qwen3_moe-tiny")
    with pytest.raises(ValueError, match="num_attention_heads over attn_tp=8"):
        RankPlan.make(config, hf.FAMILIES["qwen3_moe"], hc.Layout(8, attn_tp=8), 0)


@pytest.mark.parametrize("compiled", [False, True], ids=["modules", "compiled"])
def test_bench_model_on_cpu(pool, compiled):
    """`hybridcomm bench model`'s worker call (eager on CPU): every point times, checks and
    reports, with transformers' modules as they are or compiled regions; the NCCL rows, which
    need GPUs, are skipped with the reason."""
    from hybridcomm.bench.model import COMPUTE_NOTES, format_model_table, run_model_bench, verdict

    outs = pool(4).run(run_model_bench, "qwen3_moe-tiny", 1, "dp2xtp2", None, [[3, 0], [1, 2]],
                       ["reference", "nccl_symm"], 3, "float32", True, 0, False, compiled, timeout=300)
    assert all(o["results"] == outs[0]["results"] for o in outs)  # phases are each rank's own seconds
    runs = outs[0]["results"]
    assert [r["tokens_per_dp"] for r in runs] == [[3, 0], [1, 2]]
    for run in runs:
        row, skipped = run["backends"]
        assert row["max_rel_error"] < 1e-5 and row["top1_agreement"] == 1.0
        assert row["step_us"] > 0 and row["comm_us"] > 0 and "vs_fp32" not in row  # fp32: no noise floor
        assert "needs CUDA" in skipped["skipped"] and skipped["backend"] == "nccl-symm"
        assert run["compiled"] is compiled
    table = format_model_table(outs[0])
    assert "reference" in table and "skipped: nccl_symm needs CUDA" in table and "PASS" in verdict(outs[0])
    assert COMPUTE_NOTES[compiled] in table and COMPUTE_NOTES[not compiled] not in table


def test_bench_model_bf16_beside_its_noise_floor(pool):
    """A 16-bit run is also compared with the single-device model in fp32, beside the 16-bit
    single-device model's own error against it (the noise floor): both really round (errors
    above fp32's), ours is a faithful bf16 computation (median error near the floor's), and the
    table and verdict carry both; fp32 runs have no such comparison."""
    from hybridcomm.bench.model import format_model_table, run_model_bench, verdict

    outs = pool(4).run(run_model_bench, "deepseek_v3-featured", None, "dp4", None, [[2, 1, 0, 2]], ["reference"],
                       2, "bfloat16", True, 0, timeout=300)
    row = outs[0]["results"][0]["backends"][0]
    ours, floor = row["vs_fp32"]["ours"], row["vs_fp32"]["single_device"]
    for side in (ours, floor):
        assert 1e-4 < side["median_rel_error"] <= side["max_rel_error"] < 1, row
    assert ours["median_rel_error"] < 3 * floor["median_rel_error"], row
    assert "fp32: ours" in format_model_table(outs[0]) and "noise floor" in verdict(outs[0])


def test_bench_model_token_items():
    from hybridcomm.bench.model import counts_for

    assert counts_for(hc.Layout(4), "uneven") == [16, 1, 1, 1]
    assert counts_for(hc.Layout(4, attn_tp=4), "uneven") is None  # one DP group: nothing to skew
    assert counts_for(hc.Layout(4, attn_tp=2), 5) == [5, 5]
    assert counts_for(hc.Layout(4, attn_tp=2), [64, 1]) == [64, 1]
    assert counts_for(hc.Layout(4), [64, 1]) is None


def test_deepseek_v3_layers_that_fit_one_h200_with_the_reference():
    """hf.memory: a DeepSeek-V3 layer is ~21.4 GiB in bf16 (256 experts of 3 x 7168 x 2048), so
    the single-device reference holds 5 layers on an H200 (139 GiB usable) and fewer on less."""
    from hybridcomm.hf import memory

    fixed, per_layer = memory.layer_bytes("deepseek-v3", torch.bfloat16)
    experts = 256 * 3 * 7168 * 2048 * 2
    assert experts < per_layer < experts * 1.05
    assert memory.fit_layers("deepseek-v3", 139 << 30, torch.bfloat16) == 5
    assert memory.fit_layers("deepseek-v3", 80 << 30, torch.bfloat16) == 3
    with pytest.raises(ValueError, match="does not fit"):
        memory.fit_layers("deepseek-v3", 20 << 30, torch.bfloat16)


def _nccl_symm_on_cpu() -> str:
    try:
        hc.Communicator(hc.Layout(2), device="cpu", backend="nccl_symm")
    except ValueError as e:
        return str(e)
    return "no error"


def test_nccl_symm_backend_needs_cuda(pool):
    for message in pool(2).run(_nccl_symm_on_cpu):
        assert "backend='nccl_symm' needs a CUDA device" in message
