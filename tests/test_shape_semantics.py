"""``shape.semantics`` against the ONNX definitions, edge by edge.

Written from mutation testing (docs/mutation.md): Slice is compared with Python's own
slicing (which clamps like ONNX) over every small case; Reshape, broadcasting and axis
normalisation each get the nearest inputs on both sides of every condition, with the
exact refusal text.
"""

from __future__ import annotations

import itertools

import onnx_ir as ir
import pytest

from rnn_rewrite_rules.shape import Dim
from rnn_rewrite_rules.shape.dim import ONE, ZERO
from rnn_rewrite_rules.shape.semantics import (
    INT64_MAX,
    INT64_MIN,
    broadcast,
    clamp_bounds,
    normalize_axes,
    reshape,
    slice_indices,
    slice_length,
)

B = Dim.sym(ir.Value(name="x"), 0)  # a size that may be 0
C = Dim.sym(ir.Value(name="x"), 1)
K = Dim.const


# normalize_axes ------------------------------------------------------------------------


def test_axes_count_negatives_from_the_end_and_keep_their_order() -> None:
    assert normalize_axes([2, -1, 0, -3], 4) == [2, 3, 0, 1]
    assert normalize_axes([-4, 3], 4) == [0, 3]
    assert normalize_axes([], 0) == []


@pytest.mark.parametrize("axes", [[4], [-5], [0, 4], [1, -3], [0, -4]])
def test_axes_out_of_range_or_repeated_are_refused(axes: list[int]) -> None:
    assert normalize_axes(axes, 4) is None


def test_no_axis_exists_in_a_scalar() -> None:
    assert normalize_axes([0], 0) is None


# reshape -------------------------------------------------------------------------------


def test_reshape_refusals_say_why() -> None:
    assert reshape([B, K(6)], [K(-1), K(-1)], 0) == "more than one -1 in the target"
    assert reshape([B, K(6)], [K(-1), K(2), K(-1)], 0) == "more than one -1 in the target"
    assert reshape([B, K(6)], [K(-2), K(6)], 0) == "negative target element -2"
    assert reshape([B, K(6)], [K(0), K(0), K(0)], 0) == (
        "target element 2 is 0 but the input has only 2 axes"
    )


def test_reshape_zero_copies_the_input_size_unless_allowzero() -> None:
    assert reshape([B, K(6)], [K(0), K(6)], 0) == (B, K(6))
    assert reshape([B, K(6)], [K(0), K(6)], 1) == (ZERO, K(6))
    # with allowzero a 0 past the input's rank is a size, not an error
    assert reshape([B, K(6)], [K(0), K(0), K(0)], 1) == (ZERO, ZERO, ZERO)


def test_reshape_unknown_elements_stay_unknown() -> None:
    assert reshape([B, K(6)], [None, K(6)], 0) == (None, K(6))


def test_reshape_minus_one_is_the_element_count_over_the_others() -> None:
    assert reshape([B, K(6)], [K(-1), K(3)], 0) == (B * 2, K(3))
    assert reshape([B, K(6)], [K(0), K(-1)], 0) == (B, K(6))
    assert reshape([B, K(6)], [K(3), K(-1), K(1)], 0) == (K(3), B * 2, ONE)
    assert reshape([B, C], [K(-1)], 0) == (B * C,)


def test_reshape_minus_one_stays_unknown_when_it_cannot_be_divided_out() -> None:
    assert reshape([B, K(6)], [K(-1), K(4)], 0) == (None, K(4))  # 6b / 4 is not exact
    assert reshape([B, K(6)], [K(-1), None], 0) == (None, None)
    # a divisor of several terms (b + 1) is not divided
    assert reshape([B, K(6)], [K(-1), B + 1], 0) == (None, B + 1)


def test_reshape_computed_elements_are_known_only_where_both_readings_agree() -> None:
    """A computed element that may be 0 would copy the input's size instead."""
    assert reshape([B, K(6)], [B, K(6)], 0) == (B, K(6))  # equals the copy
    assert reshape([B, K(6)], [B + 1, K(6)], 0)[0] == B + 1  # positive: never 0
    assert reshape([B, K(6)], [K(6), B], 0) == (K(6), None)  # may be 0, differs
    assert reshape([B, K(6)], [B - 1, K(6)], 0) == (None, K(6))  # may be negative
    assert reshape([B, K(6)], [C, K(6)], 1) == (C, K(6))  # allowzero: no copying


def test_reshape_computed_element_past_the_input_rank() -> None:
    assert reshape([B], [K(1), B + 1], 0) == (ONE, B + 1)
    assert reshape([B], [K(1), B], 0) == (ONE, None)


# broadcast -----------------------------------------------------------------------------


def test_broadcast_pads_with_ones_and_takes_the_size_other_than_one() -> None:
    assert broadcast([B, ONE], [K(3)]) == (B, K(3))
    assert broadcast([K(2), K(3)], [K(3)]) == (K(2), K(3))
    assert broadcast([ONE], [ONE]) == (ONE,)
    assert broadcast([B], [B], [ONE]) == (B,)
    assert broadcast([]) == ()


def test_broadcast_of_two_different_sizes_is_unknown() -> None:
    assert broadcast([B], [C]) == (None,)
    assert broadcast([K(2), B], [K(3), B]) == (None, B)


# slice ---------------------------------------------------------------------------------


def test_slice_indices_match_python_slicing() -> None:
    """Python's slice clamps exactly as ONNX Slice does, for every sign of start/end/step."""
    for n, start, end, step in itertools.product(
        range(5), range(-7, 8), range(-7, 8), (-3, -2, -1, 1, 2, 3)
    ):
        expected = list(range(n))[start:end:step]
        assert slice_indices(n, start, end, step) == expected, (n, start, end, step)
        assert slice_length(K(n), start, end, step) == K(len(expected))


def test_slice_bounds_at_the_int64_extremes() -> None:
    assert clamp_bounds(4, 0, INT64_MAX, 1) == (0, 4)
    assert clamp_bounds(4, INT64_MIN, INT64_MAX, 1) == (0, 4)
    assert clamp_bounds(4, -1, INT64_MIN, -1) == (3, -1)
    assert clamp_bounds(4, INT64_MAX, INT64_MIN, -1) == (3, -1)
    assert clamp_bounds(0, -1, INT64_MIN, -1) == (-1, -1)
    with pytest.raises(ValueError, match=r"^Slice step 0$"):
        clamp_bounds(4, 0, 4, 0)


def test_symbolic_slice_length_is_known_only_for_the_whole_axis() -> None:
    assert slice_length(B, 0, INT64_MAX, 1) == B
    assert slice_length(B, 0, INT64_MAX // 2, 1) == B
    assert slice_length(B, 0, INT64_MAX // 2 - 1, 1) is None
    assert slice_length(B, 1, INT64_MAX, 1) is None
    assert slice_length(B, 0, INT64_MAX, 2) is None
    assert slice_length(B, -1, INT64_MIN, -1) == B
    assert slice_length(B, -1, INT64_MIN // 2, -1) == B
    assert slice_length(B, -1, INT64_MIN // 2 + 1, -1) is None
    assert slice_length(B, -2, INT64_MIN, -1) is None
    assert slice_length(B, 0, INT64_MIN, -1) is None
    assert slice_length(B, -1, INT64_MIN, -2) is None
