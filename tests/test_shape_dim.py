"""``Dim``, the exact polynomial sizes every proof compares: one case per operation.

Written from mutation testing (docs/mutation.md).
"""

from __future__ import annotations

import onnx_ir as ir

from rnn_rewrite_rules.shape import ONE, ZERO, Dim, Sym, product

_X, _Y = ir.Value(name="x"), ir.Value(name="")
S, T, U = Dim.sym(_X, 0), Dim.sym(_X, 1), Dim.sym(_Y, 0)


def test_constants() -> None:
    assert Dim.const(0) == ZERO == Dim() and ZERO.terms == ()
    assert Dim.const(3).terms == (((), 3),) and Dim.const(3).value == 3
    assert ONE.value == 1 and ZERO.value == 0 and Dim.const(-2).value == -2
    assert S.value is None and (S + 1).value is None
    assert Dim.const(3).is_const and not S.is_const and ZERO.is_const


def test_symbols_are_axes_of_values_compared_by_identity() -> None:
    assert Dim.sym(_X, 0) == S and S != T and S != U
    assert S.terms == (((Sym.of(_X, 0),), 1),)
    assert Sym.of(_X, 1).axis == 1 and Sym.of(_X, 1).key == (id(_X), 1)
    assert Sym.of(_X, 0) != Sym.of(ir.Value(name="x"), 0)  # same name, another value


def test_sign() -> None:
    assert S.nonnegative and (S * T + 2).nonnegative and ZERO.nonnegative
    assert not (S - 1).nonnegative and not Dim.const(-1).nonnegative
    assert (S + 1).positive and Dim.const(2).positive and ONE.positive
    assert not S.positive and not ZERO.positive and not (S - T + 1).positive
    assert not Dim.const(-1).positive and not (S * 0 + 1 - S).positive


def test_arithmetic() -> None:
    assert S + T == T + S and (S + T).terms == tuple(sorted((S + T).terms))
    assert S + 2 == 2 + S and (S + 2).terms == (((), 2), ((Sym.of(_X, 0),), 1))
    assert S - S == ZERO and (S + T - T) == S and (S - 3) + 3 == S
    assert Dim.const(2) - S == -(S - 2) and -ZERO == ZERO
    assert S * 3 == 3 * S == S + S + S and S * ZERO == ZERO and S * 1 == S
    assert S * T == T * S and (S * T).terms == (((Sym.of(_X, 0), Sym.of(_X, 1)), 1),)
    assert (S + 1) * (S - 1) == S * S - 1
    assert Dim.const(2) * 3 == Dim.const(6) and Dim.const(2) + Dim.const(-2) == ZERO


def test_divide_is_exact_or_none() -> None:
    assert (S * 6).divide(3) == S * 2
    assert type(Dim.const(6).divide(2).value) is int and str((S * 6).divide(3)) == "2*x[0]"
    assert (S * T * 4 + S * 2).divide(S * 2) == T * 2 + 1
    assert (S * T).divide(T) == S and Dim.const(6).divide(2) == Dim.const(3)
    assert Dim.const(6).divide(Dim.const(-3)) == Dim.const(-2)
    assert (S * 3).divide(2) is None  # 3 is not a multiple of 2
    assert (S + 1).divide(S) is None  # 1 has no factor S
    assert (S * S).divide(S * S) == ONE and (S * T).divide(S * S) is None
    assert S.divide(S + T) is None and S.divide(S + 1) is None  # not one monomial
    assert S.divide(ZERO) is None
    assert ZERO.divide(S) == ZERO


def test_product() -> None:
    assert product([]) == ONE
    assert product([S, Dim.const(2), T]) == S * T * 2
    assert product([S, ZERO]) == ZERO


def test_str() -> None:
    assert str(ZERO) == "0" and str(Dim.const(-4)) == "-4"
    assert str(S) == "x[0]" and str(U) == "?[0]"
    assert str(S * 2) == "2*x[0]" and str(S * T) == "x[0]*x[1]"
    assert str(S + 3) == "3 + x[0]"
    assert str(Sym.of(_X, 1)) == "x[1]"
