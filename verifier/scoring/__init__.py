"""Scoring: the verifier's rules. Math answers (math-verify, sympy, the expression-bomb
guards), code run in the sandbox against test cases (harness, checkers, output
comparison), the judging profiles, and the Scorer that dispatches items to them."""
