from hybridcomm import algorithms
from hybridcomm.algorithms import KiB, MiB, Rule, choose


def never_blocked(algorithm):
    return None


def test_the_first_rule_that_holds_the_message_wins():
    assert choose("all_reduce", 2 * KiB, never_blocked).algorithm == "one_shot"
    assert choose("all_reduce", 512 * KiB, never_blocked).algorithm == "one_shot"
    assert choose("all_reduce", 512 * KiB + 16, never_blocked).algorithm == "two_shot"
    assert choose("all_reduce", 4 * MiB, never_blocked).algorithm == "two_shot_bulk"
    big = choose("all_reduce", 64 * MiB, never_blocked)
    assert (big.backend, big.algorithm) == ("nccl", "nccl")


def test_a_blocked_kernel_falls_back_to_nccl_with_the_reason():
    seen = []

    def blocked(algorithm):
        seen.append(algorithm)
        return "rows of 6 bytes are not a multiple of 16"

    choice = choose("all_gather_v", 4 * KiB, blocked)
    assert (choice.backend, choice.reason) == ("nccl", "rows of 6 bytes are not a multiple of 16")
    assert seen == ["one_shot"]


def test_every_op_has_an_unbounded_last_rule_and_increasing_limits():
    for op, rules in algorithms.TABLE.items():
        assert rules[-1].max_bytes is None, op
        limits = [r.max_bytes for r in rules[:-1]]
        assert limits == sorted(limits), op


def test_forced_tables_run_one_algorithm_at_every_size():
    table = algorithms.forced({"all_reduce": "two_shot"})
    assert table["all_reduce"] == (Rule(None, "nvlink", "two_shot"),)
    assert table["all_gather_v"] == algorithms.TABLE["all_gather_v"]
