"""Imported once by the math pool's forkserver, before it forks any worker.

Importing sympy and math-verify and scoring one trivial item takes about a second; doing it here
means every worker (and every replacement of a killed worker) starts warm, for the cost of a fork.
"""

from verifier.scoring import math_score

math_score.warm_up()
