from hybridcomm import Layout, abi, algorithms, ops
from hybridcomm.algorithms import KiB, MiB, Rule, choose


def never_blocked(algorithm):
    return None


# A table of its own: the tuned TABLE's limits move with measurements, the rule does not.
TABLE = {"all_reduce": (Rule(128 * KiB, "nvlink", "one_shot"), Rule(1 * MiB, "nvlink", "one_shot_lamport"),
                        Rule(4 * MiB, "nvlink", "two_shot_bulk"), Rule(None, "nccl", "nccl")),
         "all_gather_v": (Rule(256 * KiB, "nvlink", "one_shot"), Rule(None, "nccl", "nccl"))}


def test_the_first_rule_that_holds_the_message_wins():
    assert choose("all_reduce", 2 * KiB, never_blocked, TABLE).algorithm == "one_shot"
    assert choose("all_reduce", 128 * KiB, never_blocked, TABLE).algorithm == "one_shot"
    assert choose("all_reduce", 128 * KiB + 16, never_blocked, TABLE).algorithm == "one_shot_lamport"
    assert choose("all_reduce", 4 * MiB, never_blocked, TABLE).algorithm == "two_shot_bulk"
    big = choose("all_reduce", 64 * MiB, never_blocked, TABLE)
    assert (big.backend, big.algorithm) == ("nccl", "nccl")


def test_a_blocked_kernel_falls_back_to_nccl_with_the_reason():
    seen = []

    def blocked(algorithm):
        seen.append(algorithm)
        return "rows of 6 bytes are not a multiple of 16"

    choice = choose("all_gather_v", 4 * KiB, blocked, TABLE)
    assert (choice.backend, choice.reason) == ("nccl", "rows of 6 bytes are not a multiple of 16")
    assert seen == ["one_shot"]


def test_a_blocked_kernel_passes_the_call_to_the_next_rule_of_ours():
    """One-shot cannot run it (say, the workspace): the Lamport rule, for larger messages, can."""
    def blocked(algorithm):
        return "too big for the workspace" if algorithm == "one_shot" else None

    choice = choose("all_reduce", 2 * KiB, blocked, TABLE)
    assert (choice.backend, choice.algorithm) == ("nvlink", "one_shot_lamport")
    assert "one_shot blocked: too big for the workspace" in choice.reason
    every = choose("all_reduce", 2 * KiB, lambda algorithm: f"{algorithm} cannot", TABLE)
    assert (every.backend, every.reason) == ("nccl", "one_shot cannot")


def test_every_op_has_an_unbounded_last_rule_and_increasing_limits():
    for op, rules in algorithms.TABLE.items():
        assert rules[-1].max_bytes is None, op
        limits = [r.max_bytes for r in rules[:-1]]
        assert limits == sorted(limits), op


def test_forced_tables_run_one_algorithm_at_every_size():
    table = algorithms.forced({"all_reduce": "two_shot"})
    assert table["all_reduce"] == (Rule(None, "nvlink", "two_shot"),)
    assert table["all_gather_v"] == algorithms.TABLE["all_gather_v"]


def test_every_kernel_rule_names_an_algorithm_of_the_registry():
    for named in algorithms.NAMED_TABLES.values():
        for table in algorithms.node_tables(named).values():  # per node count
            for key, rules in table.items():
                for rule in rules:
                    if rule.backend == "nvlink":
                        ops.OPS[algorithms.key_op(key)].algorithm(rule.algorithm)  # KeyError naming the op if not
    assert {algorithms.key_op(key) for key in algorithms.TABLE} == set(algorithms.TABLE) & set(ops.OPS) == set(ops.OPS)
    for key in algorithms.TABLE:  # rules for one layout: transitions only, under a layout's attention name
        op, _, layout = key.partition("@")
        assert not layout or ops.OPS[op].on_world and Layout.parse(layout).attention_name == layout, key


LAYOUT_TABLE = {"scatter_tokens": (Rule(2 * MiB, "nvlink", "one_shot_lamport"), Rule(None, "nccl", "nccl")),
                "scatter_tokens@tp4": (Rule(1 * MiB, "nvlink", "one_shot_lamport"), Rule(16 * MiB, "nvlink", "two_step"),
                                       Rule(None, "nccl", "nccl"))}


def test_a_layout_with_rules_of_its_own_reads_them_and_the_others_read_the_op_s():
    tp4 = choose("scatter_tokens", 2 * MiB, never_blocked, LAYOUT_TABLE, "tp4")
    assert (tp4.algorithm, tp4.reason) == ("two_step", "table rule <= 16777216 bytes for tp4")
    for layout in ("dp2xtp2", "dp4", None):
        other = choose("scatter_tokens", 2 * MiB, never_blocked, LAYOUT_TABLE, layout)
        assert (other.algorithm, other.reason) == ("one_shot_lamport", "table rule <= 2097152 bytes")
    # Past its own kernels a layout's blocked call goes on down its own rules.
    blocked = choose("scatter_tokens", 512 * KiB, lambda a: "no" if a == "one_shot_lamport" else None,
                     LAYOUT_TABLE, "tp4")
    assert blocked.algorithm == "two_step" and "one_shot_lamport blocked: no" in blocked.reason


def test_forcing_an_op_drops_its_rules_for_single_layouts():
    table = algorithms.forced({"scatter_tokens": "one_shot"}, {**algorithms.TABLE, **LAYOUT_TABLE})
    assert "scatter_tokens@tp4" not in table and table["scatter_tokens"] == (Rule(None, "nvlink", "one_shot"),)
    assert choose("scatter_tokens", 2 * MiB, never_blocked, table, "tp4").algorithm == "one_shot"
    assert table["gather_tokens@dp4"] == algorithms.TABLE["gather_tokens@dp4"]  # other ops keep theirs


def test_capacity_per_peer_follows_the_protocol():
    ar = ops.OPS["all_reduce"]
    one, two, bulk = (ar.algorithm(n) for n in ("one_shot", "two_shot", "two_shot_bulk"))
    assert ar.per_peer_bytes(one, 1000 * 16, 4) == 1000 * 16
    assert ar.per_peer_bytes(two, 1000 * 16, 4) == 4000  # 2000 lanes of 8 bytes over 4 members
    assert ar.per_peer_bytes(bulk, 1001 * 16, 4) == 251 * 16  # 16-byte units, rounded up
    assert (one.protocol.capacity(1 << 20), bulk.protocol.capacity(1 << 20)) == (1 << 19, 1 << 20)


def test_transitions_name_the_op_they_are_when_attention_tp_is_1():
    assert ops.OPS["gather_tokens"].reduces_to == {"attn_tp": "all_gather_v"}
    assert ops.OPS["scatter_tokens"].reduces_to == {"attn_tp": "reduce_scatter_v"}
    assert ops.op_name(abi.OpCode.GATHER_TOKENS) == "gather_tokens"


def test_every_mismatch_field_the_kernels_report_has_words():
    from hybridcomm.backends.nvlink import MISMATCH_WORDS

    assert set(MISMATCH_WORDS) == set(abi.CallField)
    word = (abi.ErrorCode.ARGUMENT_MISMATCH | abi.OpCode.ALL_REDUCE << abi.ERROR_OP_SHIFT
            | 5 << abi.ERROR_GROUP_SHIFT | 3 << abi.ERROR_PEER_SHIFT | abi.CallField.WIDTH << abi.ERROR_DETAIL_SHIFT)
    assert abi.decode_error(word) == abi.RecordedError(abi.ErrorCode.ARGUMENT_MISMATCH, abi.OpCode.ALL_REDUCE, 5, 3,
                                                       abi.CallField.WIDTH)
