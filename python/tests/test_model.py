"""Symbols, extents, bindings and policies against Python arithmetic as the reference."""
import math

import numpy as np
import pytest

import graphsafe as gs


def ref_rows(lens):
    return sum(math.ceil(l / 4) for l in lens)


def test_extent_operators_evaluate_like_python_arithmetic(decode_symbols):
    B, L = decode_symbols
    rows = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))
    need = (rows * 512 + B * 3) // 2
    for lens in ([3, 5], [15, 17], [64, 1], [0, 0]):
        b = gs.Bindings({B: len(lens), L: lens})
        assert rows.evaluate(b) == ref_rows(lens)
        assert need.evaluate(b) == (ref_rows(lens) * 512 + len(lens) * 3) // 2
    b = gs.Bindings({B: 2, L: [3, 5]})
    assert (2 * B + 1).evaluate(b) == 5
    assert gs.max(B, 7).evaluate(b) == 7 and gs.min(B, 7).evaluate(b) == 2
    assert gs.round_up(B * 5, 8).evaluate(b) == 16
    assert gs.max_over(L, lambda l: l * 2).evaluate(b) == 10
    # capacity bound: every length at its capacity (64): 2 * ceil(64/4) rows
    assert rows.capacity_bound(b) == 2 * 16
    assert str(rows * 512) == "(sum_b(ceil_div(seq_lens[b], 4)) * 512)"
    assert rows.dynamic_symbols == [L] and rows.has_capacity_bound and rows.monotone
    assert (B * 4).is_static and not rows.is_static


def test_extents_refuse_subtraction_and_true_division(decode_symbols):
    B, _ = decode_symbols
    with pytest.raises(TypeError, match="monotone"):
        B - 1
    with pytest.raises(TypeError, match="monotone"):
        10 - gs.Extent(B)
    with pytest.raises(TypeError, match="ceil_div"):
        B / 2


def test_symbols_compare_by_identity_and_describe_themselves():
    a = gs.Symbol.dynamic("tokens", capacity=128)
    b = gs.Symbol.dynamic("tokens", capacity=128)
    assert a == gs.Symbol.from_id(a.id) and a != b
    assert len({a, gs.Symbol.from_id(a.id), b}) == 2
    assert (a.kind, a.capacity, a.is_dynamic) == ("dynamic", 128, True)
    f = gs.Symbol.fixed("heads")
    assert (f.kind, f.capacity, f.length) == ("fixed", None, None)
    L = gs.Symbol.batch("lens", f)
    assert L.length == f and L.kind == "batch"


@pytest.mark.parametrize("value", [
    [3, 5, 9], (3, 5, 9), np.array([3, 5, 9], dtype=np.int64), np.array([3, 5, 9], dtype=np.int32),
    np.array([3, 0, 5, 0, 9], dtype=np.int16)[::2],  # non-contiguous, other dtype: element by element
])
def test_bindings_take_lists_tuples_and_arrays(decode_symbols, value):
    B, L = decode_symbols
    b = gs.Bindings()
    b[B] = 3
    b.set(L, value)
    assert b[L] == [3, 5, 9] and b.values(L) == [3, 5, 9]
    assert b[B] == 3 and B in b and b.describe(L) == "seq_lens = [3, 5, 9]"
    assert gs.sum_over(L, lambda l: l).evaluate(b) == 17


def test_bindings_take_numpy_scalars(decode_symbols):
    B, _ = decode_symbols
    b = gs.Bindings({B: np.int64(4)})
    assert b.value(B) == 4
    b[B] = np.array(6)
    assert b[B] == 6


def test_a_value_above_capacity_is_a_capacity_error_naming_value_and_limit(decode_symbols):
    B, L = decode_symbols
    b = gs.Bindings({B: 2})
    with pytest.raises(gs.CapacityError) as e:
        b[L] = [3, 65]
    assert "65" in str(e.value) and "64" in str(e.value)
    assert isinstance(e.value, gs.InvalidArgumentError) and isinstance(e.value, ValueError)
    assert L not in b  # nothing half-set


def test_bad_values_are_rejected_with_the_symbol_named(decode_symbols):
    B, L = decode_symbols
    b = gs.Bindings({B: 2})
    # A batch of 2 given 3 values: refused when set, since its length is already bound.
    with pytest.raises(gs.InvalidArgumentError, match="'seq_lens' has 3 values but its length 'batch' is 2"):
        b[L] = [3, 5, 7]
    assert L not in b  # nothing half-set
    with pytest.raises(gs.InvalidArgumentError, match="negative|-1"):
        b[B] = -1
    with pytest.raises(gs.InvalidArgumentError, match="integers"):
        b[L] = [1.5, 2]
    with pytest.raises(gs.InvalidArgumentError, match="bool"):
        b[B] = True

    class DeviceTensor:  # what a CUDA tensor reports through DLPack
        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(gs.InvalidArgumentError, match="device memory"):
        b[L] = DeviceTensor()


def test_evaluating_an_unbound_symbol_names_it(decode_symbols):
    B, L = decode_symbols
    with pytest.raises(gs.UnboundSymbolError, match="seq_lens"):
        gs.sum_over(L, lambda l: l).evaluate({B: 2})


def test_policies_size_as_documented(decode_symbols):
    B, L = decode_symbols
    rows = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))
    b = {B: 2, L: [3, 5]}
    exact = gs.exact_at_capture.size("kv", rows, b)
    assert exact.count == ref_rows([3, 5]) and not exact.replay_safe
    cap = gs.capacity_bound.size("kv", rows, b)
    assert cap.count == 2 * 16 and cap.replay_safe
    sq = gs.static_query_bound(B * 16).size("kv", rows, b)
    assert sq.count == 32 and sq.replay_safe
    assert [p.name for p in (gs.capacity_bound, gs.exact_at_capture)] == ["capacity-bound", "exact-at-capture"]


def test_capacity_bound_refuses_a_dynamic_symbol_without_capacity():
    n = gs.Symbol.dynamic("selected_rows")
    with pytest.raises(gs.PolicyRefusal, match="selected_rows"):
        gs.capacity_bound.size("idx", n * 4, {n: 3})
