"""The names of the metrics a run logs, declared once (docs/contracts.md 3).

Rule: a metric's name is spelled here and nowhere else in ``trainer/`` (but in
trainer/magic/reference_step.py, plain torch in one file by design, which uses the same strings). The
loop, the backends' update, the evaluation, the logger, the plots and the ablations import these
constants; the per-source families are built by :func:`reward_by_source` and
:func:`eval_avg_at_k`. Every name has a one-line meaning in :data:`METRICS` (per-step keys of
``metrics.jsonl``) or :data:`ABLATION_METRICS` (a variant's summary, trainer/ablation/designs.py), and
docs/contracts.md's table lists them all; tests/test_metric_names.py checks both against a real
training step.
"""

from __future__ import annotations

# -- the step -----------------------------------------------------------------------------------
STEP = "step"
STAGE = "stage"
STAGE_MAX_RESPONSE_LENGTH = "stage/max_response_length"

# -- the rollout batch (trainer/loop.py) ----------------------------------------------------------
REWARD_MEAN = "reward/mean"
REWARD_BY_SOURCE = "reward/by_source/<src>"
REWARD_NO_ANSWER_FRAC = "reward/no_answer_frac"
REWARD_SOLVE_NONE_FRAC = "reward/solve_none_frac"
REWARD_SOLVE_ALL_FRAC = "reward/solve_all_frac"
REWARD_UNJUDGED = "reward/unjudged"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_MAX = "response_length/max"
TRUNCATED_FRAC = "truncated/frac"
FILTERED_FRAC = "filtered/frac"
ROLLOUT_RESPONSES = "rollout/responses"
ROLLOUT_JUDGED = "rollout/judged"
UPDATE_SKIPPED = "update/skipped"

# -- the update (trainer/magic/rules.py, trainer/backends/common.py) ------------------------------------
LOSS_POLICY = "losses/policy"
LOSS_CLIPFRAC = "losses/clipfrac"
LOSS_CLIPFRAC_LOW = "losses/clipfrac_low"
LOSS_CLIPFRAC_HIGH = "losses/clipfrac_high"
LOSS_APPROX_KL = "losses/approx_kl"
LOSS_RATIO_MEAN = "losses/ratio_mean"
LOSS_ENTROPY = "losses/entropy"
LOSS_ENTROPY_BONUS = "losses/entropy_bonus"
LOSS_KL = "losses/kl"
LOSS_TOTAL = "losses/total"
LOSS_NUM_TOKENS = "losses/num_tokens"
ENTROPY = "entropy"
ENTROPY_ROLLOUT = "entropy/rollout"
ENTROPY_COEF = "entropy/coef"
ENTROPY_NEXT_COEF = "entropy/next_coef"
GRAD_NORM = "grad_norm"
GRAD_NORM_MAX = "grad_norm/max"
OPTIMIZER_STEPS = "optimizer_steps"
LR = "lr"
UPDATE_COMPUTED_OVER_REAL = "update/computed_over_real_tokens"
UPDATE_OVERSIZED_ROWS = "update/oversized_rows"

# -- timing -------------------------------------------------------------------------------------
TIME_GENERATE = "time/generate"
TIME_VERIFY_WAIT = "time/verify_wait"
TIME_UPDATE = "time/update"
TIME_SYNC = "time/sync"
TIME_STEP = "time/step"
TIME_EVAL = "time/eval"

# -- evaluation (trainer/evaluation.py) -----------------------------------------------------------
EVAL_ACCURACY = "eval/accuracy"
EVAL_PASS_AT_K = "eval/pass@k"
EVAL_AVG_AT_K = "eval/<source>/avg@<k>"
EVAL_PREFIX = "eval/"

# -- a variant's summary (trainer/ablation/designs.py) ---------------------------------------------------
REWARD_NON_TRUNCATED = "reward/non_truncated"
ENTROPY_GAP = "entropy/gap"
EVAL_ACCURACY_BEST = "eval/accuracy_best"
EVAL_ACCURACY_AUC = "eval/accuracy_auc"
EVAL_ACCURACY_LAST3 = "eval/accuracy_last3"
EVAL_PASS_LAST3 = "eval/pass@k_last3"
EVAL_LAST_STAGE_GAIN = "eval/last_stage_gain"
TOKENS = "tokens"


def reward_by_source(source: str) -> str:
    """``reward/by_source/<src>``: the mean reward of one data source's responses."""
    return f"reward/by_source/{source}"


def eval_avg_at_k(source: str, k: int) -> str:
    """``eval/<source>/avg@<k>``: avg@k of one data source's held-out problems."""
    return f"eval/{source}/avg@{k}"


#: Every per-step key of ``metrics.jsonl`` (families as their pattern), with its meaning: the
#: rows of docs/contracts.md's table.
METRICS: dict[str, str] = {
    STEP: "the run's step (0: the evaluation before the first step)",
    STAGE: "index of the current MAGIC stage (0-based)",
    STAGE_MAX_RESPONSE_LENGTH: "the stage's response limit, tokens",
    REWARD_MEAN: "mean verifier reward of the rollout batch",
    REWARD_BY_SOURCE: "mean reward of one data source's responses",
    REWARD_NO_ANSWER_FRAC: "share of responses the verifier found no answer in (NO_ANSWER)",
    REWARD_SOLVE_NONE_FRAC: "share of groups with no correct response",
    REWARD_SOLVE_ALL_FRAC: "share of groups with every response correct",
    REWARD_UNJUDGED: "responses the verifier could not judge (count)",
    RESPONSE_LENGTH_MEAN: "mean response length, tokens",
    RESPONSE_LENGTH_MAX: "longest response, tokens",
    TRUNCATED_FRAC: "share of responses cut at the stage's limit",
    FILTERED_FRAC: "share of responses dropped by the online filter (and unjudged groups)",
    ROLLOUT_RESPONSES: "responses in the rollout batch (every rank's)",
    ROLLOUT_JUDGED: "responses the verifier judged (every rank's; with verifier.dedupe the others copy an identical one's verdict)",
    UPDATE_SKIPPED: "1 when every group was filtered out and no update ran",
    LOSS_POLICY: "PPO clipped surrogate, token mean",
    LOSS_CLIPFRAC: "share of tokens whose ratio was clipped",
    LOSS_CLIPFRAC_LOW: "share of tokens clipped at 1 - clip_low",
    LOSS_CLIPFRAC_HIGH: "share of tokens clipped at 1 + clip_high",
    LOSS_APPROX_KL: "approximate KL of the updated policy to the rollout policy",
    LOSS_RATIO_MEAN: "mean importance ratio pi / pi_old",
    LOSS_ENTROPY: "token-mean entropy of the update (the same as entropy)",
    LOSS_ENTROPY_BONUS: "-entropy_coef x entropy, the entropy term of the loss",
    LOSS_KL: "KL to the reference policy (with kl_coef > 0 or log_kl)",
    LOSS_TOTAL: "policy loss - entropy term + KL term",
    LOSS_NUM_TOKENS: "response tokens of the update",
    ENTROPY: "token-mean entropy of the policy over the update, nats",
    ENTROPY_ROLLOUT: "entropy of the rollout policy from its sampled tokens, nats",
    ENTROPY_COEF: "the entropy coefficient used this step",
    ENTROPY_NEXT_COEF: "the coefficient the adaptive controller chose for the next step",
    GRAD_NORM: "mean global gradient norm before clipping, over the optimizer steps",
    GRAD_NORM_MAX: "largest of those norms",
    OPTIMIZER_STEPS: "optimizer steps taken (N_SGD)",
    LR: "the learning rate",
    UPDATE_COMPUTED_OVER_REAL: "tokens the update's forward/backward computed (padding included) "
                               "over the real tokens of its rows",
    UPDATE_OVERSIZED_ROWS: "rows longer than max_tokens_per_micro_batch, each trained alone "
                           "(once per mini-batch holding it)",
    TIME_GENERATE: "seconds generating",
    TIME_VERIFY_WAIT: "seconds waiting for rewards after generation ended",
    TIME_UPDATE: "seconds in the update",
    TIME_SYNC: "seconds loading the new weights into the engine",
    TIME_STEP: "seconds for the whole step",
    TIME_EVAL: "seconds evaluating (evaluation steps)",
    EVAL_ACCURACY: "avg@k over all held-out problems (evaluation steps)",
    EVAL_PASS_AT_K: "pass@k over all held-out problems, k = eval.n_samples (evaluation steps)",
    EVAL_AVG_AT_K: "avg@k of one data source's held-out problems (evaluation steps)",
}

#: The names a variant's summary adds (trainer/ablation/designs.py), besides the per-step keys; each
#: may carry a window suffix (``KEY@stage1``, ``KEY@run``: trainer.ablation.designs.WINDOWS).
ABLATION_METRICS: dict[str, str] = {
    REWARD_NON_TRUNCATED: "reward / (1 - truncated fraction), per step",
    ENTROPY_GAP: "abs(entropy - entropy_target), per step",
    EVAL_ACCURACY_BEST: "best eval/accuracy of the run",
    EVAL_ACCURACY_AUC: "mean eval/accuracy over the evaluations after step 0",
    EVAL_ACCURACY_LAST3: "mean eval/accuracy over the last 3 evaluations after step 0",
    EVAL_PASS_LAST3: "mean eval/pass@k over the last 3 evaluations after step 0",
    EVAL_LAST_STAGE_GAIN: "eval/accuracy gained during the last stage",
    TOKENS: "response tokens generated for training",
}


def declared(key: str) -> bool:
    """Whether ``key`` is a per-step metric declared here (a family member matches its
    pattern)."""
    if key in METRICS:
        return True
    if key.startswith("reward/by_source/"):
        return True
    parts = key.split("/")
    return len(parts) == 3 and parts[0] == "eval" and parts[2].startswith("avg@") \
        and parts[2][4:].isdigit()
