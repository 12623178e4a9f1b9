"""Imported by the grader's forkserver (``set_forkserver_preload``) to warm math-verify before any worker
is forked: its LaTeX parser (ANTLR) and sympy keep process-wide caches that make later parses several times
cheaper, and every worker, including each replacement after a timeout, then inherits them copy-on-write
instead of rebuilding them alone. Generic answer forms only, no benchmark data.
"""

from __future__ import annotations

import logging

ANSWER_FORMS = [
    "5", "-3", "0.25", "3.14", "10^{5}", "2^{10}-1", "\\frac{1}{2}", "-\\frac{3}{4}", "\\dfrac{a}{b}",
    "\\tfrac{7}{8}", "\\sqrt{3}", "2\\sqrt{2}", "\\frac{\\sqrt{3}}{2}", "\\sqrt[3]{4}", "2\\pi", "\\frac{\\pi}{6}",
    "(1, 2)", "(-1, \\frac{1}{2})", "[0, 1)", "(-\\infty, 2]", "\\{1, 2, 3\\}", "x^2 + 2x + 1", "3x - 7",
    "y = 2x + 3", "x = 5", "\\sin x", "\\log_2 8", "e^{i\\pi}", "45^\\circ", "90^{\\circ}", "\\$5", "25\\%",
    "\\text{yes}", "\\text{(C)}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "1,000", "\\infty", "a+b+c",
    "\\binom{5}{2}", "5!", "|x|", "\\left(\\frac{1}{2}\\right)^2",
]  # fmt: skip


def warm_up() -> None:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    for form in ANSWER_FORMS:
        gold = parse(f"\\boxed{{{form}}}", parsing_timeout=5)
        pred = parse(f"We compute the value step by step, so the answer is $\\boxed{{{form}}}$.", parsing_timeout=5)
        verify(gold, pred, timeout_seconds=5)
        parse(f"Therefore the final answer is ${form}$.", parsing_timeout=5)


warm_up()
