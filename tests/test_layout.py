import pytest

from hybridcomm import Layout


def test_dp2_tp2_coordinates_follow_the_contract():
    lay = Layout(4, attn_tp=2, moe_tp=2)
    assert (lay.attn_dp, lay.moe_ep) == (2, 2)
    c = lay.coords(3)
    assert (c.attn_dp_rank, c.attn_tp_rank, c.moe_ep_rank, c.moe_tp_rank, c.node) == (1, 1, 1, 1, 0)
    assert lay.group_ranks("attn_tp", 2) == (2, 3)
    assert lay.group_ranks("attn_dp", 1) == (1, 3)
    assert lay.group_ranks("world", 2) == (0, 1, 2, 3)


def test_attention_and_moe_axes_are_independent():
    lay = Layout(8, attn_tp=2, moe_tp=4, ranks_per_node=4)
    c = lay.coords(6)
    assert (c.attn_dp_rank, c.attn_tp_rank) == (3, 0)
    assert (c.moe_ep_rank, c.moe_tp_rank) == (1, 2)
    assert c.node == 1
    assert lay.group_ranks("moe_tp", 6) == (4, 5, 6, 7)
    assert lay.group_ranks("moe_ep", 6) == (2, 6)
    assert lay.groups("attn_tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert lay.spans_nodes(lay.group_ranks("moe_ep", 6))
    assert not lay.spans_nodes(lay.group_ranks("moe_tp", 6))


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_rank_is_in_exactly_one_group_per_axis(world):
    for lay in Layout.all_for_world(world):
        for name in ("world", "attn_tp", "attn_dp", "moe_tp", "moe_ep"):
            groups = lay.groups(name)
            members = sorted(r for g in groups for r in g)
            assert members == list(range(world))
            for r in range(world):
                assert r in lay.group_ranks(name, r)


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=4, attn_tp=3), "attn_tp=3 does not divide world_size=4; valid attn_tp values are [1, 2, 4]"),
    (dict(world_size=6, moe_tp=4), "moe_tp=4 does not divide world_size=6; valid moe_tp values are [1, 2, 3, 6]"),
    (dict(world_size=8, ranks_per_node=3), "ranks_per_node=3 does not divide world_size=8"),
    (dict(world_size=0), "world_size must be a positive int"),
    (dict(world_size=4, attn_tp=0), "attn_tp must be a positive int"),
    (dict(world_size=4.0), "world_size must be a positive int"),
    (dict(world_size=4, ranks_per_node=0), "ranks_per_node must be a positive int or None"),
])
def test_invalid_layouts_say_what_is_wrong_and_what_is_valid(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Layout(**kwargs)


def test_bad_rank_and_group_name():
    lay = Layout(4)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 4\), got 4"):
        lay.coords(4)
    with pytest.raises(ValueError, match="unknown group name 'tp'"):
        lay.group_ranks("tp", 0)


@pytest.mark.parametrize("text, expected", [
    ("dp4", Layout(4)), ("tp4", Layout(4, attn_tp=4)), ("dp2xtp2", Layout(4, attn_tp=2)),
    ("dp2xtp2,moe_tp2", Layout(4, attn_tp=2, moe_tp=2)), ("dp8", Layout(8)),
])
def test_parse_and_name_round_trip(text, expected):
    assert Layout.parse(text) == expected
    assert Layout.parse(expected.name) == expected


@pytest.mark.parametrize("layout, attention", [
    (Layout(4, attn_tp=2, moe_tp=2), "dp2xtp2"), (Layout(4, attn_tp=4, moe_tp=4), "tp4"), (Layout(4, moe_tp=2), "dp4"),
    (Layout(8, attn_tp=2, ranks_per_node=4), "dp4xtp2"), (Layout(1), "dp1"),
])
def test_the_attention_name_leaves_out_the_moe_split(layout, attention):
    """What the transitions move depends on the attention split alone (selection tables key
    their rules for one layout by it); it parses back to the layout without its MoE split."""
    assert layout.attention_name == attention and layout.name.startswith(attention)
    assert Layout.parse(attention) == Layout(layout.world_size, attn_tp=layout.attn_tp)


def test_parse_rejects_garbage():
    with pytest.raises(ValueError, match="cannot parse layout"):
        Layout.parse("four")


def test_rank_table_lists_every_rank():
    table = Layout(4, attn_tp=2).rank_table()
    assert "dp2xtp2" in table and len(table.splitlines()) == 2 + 4
