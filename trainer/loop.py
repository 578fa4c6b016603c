"""The MAGIC training loop: a thin driver around trainer/magic/rules.py's pure rules.

One step (docs/magic.md):
  sample prompts -> generate (completions streamed to the verifier as chunks finish) -> wait for
  the remaining rewards -> online filter -> group advantages -> update (on-policy, or the
  off-policy quadruple) -> adaptive entropy update -> weight sync into the engine -> log ->
  evaluate every N steps -> stage schedule -> checkpoint every M steps and at stage ends.

The loop holds one RolloutEngine and one TrainingBackend (trainer/interfaces.py) and never
knows which implementation it has. Every random choice derives from (seed, step), so a resumed
run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from trainer import dist
from trainer.magic import rules as magic
from trainer import metric_names as mn
from trainer.backends import OptimizerConfig, create_backend, packing
from trainer.backends.reference_memory import check_reference_memory
from trainer.config import RunConfig
from trainer.data import Problem, PromptSampler, load_problems
from trainer.engines import create_engine
from trainer.evaluation import ScoredRun, generate_and_score, summarize_run, trainer_metrics
from trainer.hf_utils import CheckpointError, check_model_path, load_tokenizer, problem_prompt_ids
from trainer.interfaces import Completion, LossSettings, SamplingParams, TokenBatch, UpdatePlan
from trainer.metrics_log import MetricsLogger, stage_label
from trainer.plot import plot_run
from trainer.samples import sample_rows, write_samples
from trainer.magic.off_policy import response_indices
from trainer.tiny import save_tiny
from trainer.verifier_bridge import (
    RewardClient,
    RewardError,
    RewardStream,
    check_verdicts,
    verifier_connection,
)
from trainer.provenance import record_environment
from trainer.warmstart import warm_start
from verifier.items import NOT_A_VERDICT, Status

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"


def _seed(cfg: RunConfig, step: int, salt: int) -> int:
    return (cfg.seed * 1_000_003 + step * 7919 + salt) % (2**31 - 1)


class Trainer:
    """Owns the run: data, verifier connection, engine, backend and the MAGIC state."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False):
        self.cfg = cfg
        self.run_dir = cfg.run_dir
        self.step = 0
        self._stop_requested = False
        self._verifier: verifier_connection | None = None
        self.client: RewardClient | None = None
        self.engine = None
        self.backend = None
        self.logger: MetricsLogger | None = None
        self.resume = resume
        # Data-parallel rank (the launcher's env; the backend confirms it once initialised).
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self._prepare()

    # -- set-up: every check that can fail runs before a model is loaded ------------------
    def _prepare(self) -> None:
        cfg = self.cfg
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        latest = self.latest_checkpoint() if self.resume else None
        if self.resume and latest is None:
            raise CheckpointError(f"nothing to resume in {self.run_dir}: no checkpoint yet")
        if self.world > 1:
            m = cfg.magic
            if cfg.tiny_model is not None or cfg.warm_start.steps > 0:
                raise ValueError("tiny_model and warm_start build files and are single-process; "
                                 "with several ranks give model_path")
            if m.prompts_per_step % self.world:
                raise ValueError(f"prompts_per_step ({m.prompts_per_step}) must divide evenly "
                                 f"over the {self.world} data-parallel ranks")
        # With several ranks a tensor-parallel vLLM engine spans tp ranks (trainer/dist.py);
        # in one process it spans GPUs inside the process and the layout is trivial.
        self.layout = dist.Layout(self.rank, self.world, cfg.engine.tensor_parallel_size
                                  if self.world > 1 else 1)
        model_path = self._initial_model_path()
        if cfg.magic.keeps_reference:  # the reference copy must fit: refused before anything loads
            check_reference_memory(model_path, self._backend_config(), self.world)
        self.tokenizer = load_tokenizer(cfg.tokenizer_path or model_path)
        self.train, skipped = load_problems(cfg.data.train_files,
                                            instruction_suffix=cfg.data.instruction_suffix,
                                            skip_invalid=cfg.data.skip_invalid,
                                            lcb_style=cfg.data.lcb_style)
        self.eval_problems: list[Problem] = []
        if cfg.data.eval_files:
            self.eval_problems, _ = load_problems(cfg.data.eval_files,
                                                  instruction_suffix=cfg.data.instruction_suffix,
                                                  skip_invalid=cfg.data.skip_invalid,
                                                  lcb_style=cfg.data.lcb_style)
            if cfg.eval.max_problems:
                self.eval_problems = self.eval_problems[: cfg.eval.max_problems]
        if cfg.verifier.profile:  # one profile for every reward and evaluation
            for p in (*self.train, *self.eval_problems):
                p.profile = cfg.verifier.profile
        judged_by = Counter(p.profile or "the verifier's default"
                            for p in (*self.train, *self.eval_problems))
        log.info("judging profiles of the rewards: %s",
                 ", ".join(f"{name} ({n} problems)" for name, n in sorted(judged_by.items())),
                 extra={"profiles": dict(judged_by)})
        self.skipped_rows = skipped
        self._prompt_ids: dict[str, list[int]] = {}
        # Every prompt is tokenized once, now: a tokenizer without a chat template, or a
        # held-out prompt over the limit, fails here, before any model is loaded.
        self.train, self.dropped_long_prompts = self._drop_long_prompts(self.train)
        for p in self.eval_problems:
            self.prompt_ids(p)
        self.sampler = PromptSampler(len(self.train), cfg.seed, cfg.data.shuffle)
        self.controller = magic.AdaptiveEntropyController.from_config(cfg.magic)
        self.schedule = cfg.magic.stage_schedule()
        self.off_policy = cfg.magic.off_policy()
        self._connect_verifier()
        if cfg.warm_start.steps > 0:  # on resume the warm start's folder is already there
            model_path = self._warm_start(model_path)
        # The KL reference is the initial policy (after the warm start), also when resuming.
        self._load_models(latest / "model" if latest is not None else model_path,
                          reference_path=model_path)
        if latest is not None:
            self._restore(latest)
        if self.rank == 0:  # one writer for the run directory's files
            self.logger = MetricsLogger(self.run_dir, cfg.log, resume_after=self.step,
                                        total=cfg.total_steps,
                                        stage_names=[st.name for st in cfg.magic.stages])
            (self.run_dir / "config.yaml").write_text(_yaml(cfg.to_dict()))
            record_environment(self.run_dir)  # the code, CPU and kernels the numbers came from

    def _initial_model_path(self) -> Path:
        cfg = self.cfg
        if cfg.tiny_model is not None:

            path = self.run_dir / "init"
            if not (path / "config.json").exists():
                save_tiny(path, seed=cfg.seed, **asdict(cfg.tiny_model))
            return path
        return check_model_path(str(cfg.model_path))

    def _connect_verifier(self) -> None:
        v = self.cfg.verifier
        self._verifier = verifier_connection(v.addr, v.workers, v.connect_timeout_s,
                                             self.cfg.verifier_client_config(), v.dedupe)
        try:  # RewardError when the verifier does not answer: before any model is loaded
            self.client = self._verifier.__enter__()
        except RewardError:
            self.close()
            raise

    def _explain(self, error: RewardError) -> RewardError:
        return self._verifier.explain(error) if self._verifier is not None else error

    def _warm_start(self, model_path: Path) -> Path:
        out = self.run_dir / "warm_start"
        if not (out / "config.json").exists():
            warm_start(model_path, self.tokenizer, self.train, self.cfg.warm_start,
                       out, seed=self.cfg.seed, prompt_ids=self.prompt_ids)
        return out

    def _backend_config(self) -> Any:
        """The backend config with the run's seed, and a KL reference policy when
        ``magic.kl_coef > 0`` or ``magic.log_kl``."""
        return dataclasses.replace(self.cfg.backend, seed=self.cfg.seed,
                                   keep_reference=self.cfg.magic.keeps_reference)

    def _load_models(self, model_path: Path, reference_path: Path) -> None:
        self.backend = create_backend(self._backend_config(), model_path,
                                      optimizer=OptimizerConfig.from_magic(self.cfg.magic),
                                      reference_path=reference_path)
        if (self.backend.rank, self.backend.world_size) != (self.rank, self.world):
            raise RuntimeError(f"backend reports rank {self.backend.rank} of "
                               f"{self.backend.world_size}, the launcher {self.rank} of {self.world}")
        self.engine = create_engine(self.cfg.engine, model_path, self.tokenizer)

    # -- prompts ---------------------------------------------------------------------------
    def prompt_ids(self, problem: Problem) -> list[int]:
        """The problem's prompt tokens (cached); ValueError naming the problem when it is over
        ``magic.max_prompt_length``."""
        ids = self._prompt_ids.get(problem.id)
        if ids is None:
            ids = problem_prompt_ids(self.tokenizer, problem)
            limit = self.cfg.magic.max_prompt_length
            if len(ids) > limit:
                raise ValueError(f"problem {problem.id} ({problem.where}): prompt has {len(ids)} "
                                 f"tokens, over magic.max_prompt_length={limit}")
            self._prompt_ids[problem.id] = ids
        return ids

    def _drop_long_prompts(self, problems: list[Problem]) -> tuple[list[Problem], int]:
        """The training problems whose prompt fits ``magic.max_prompt_length``, and how many
        were dropped: a longer prompt leaves the training set before the run starts (logged
        with a count, as the released recipe's data layer does), never mid-run. ValueError
        when none fits."""
        limit = self.cfg.magic.max_prompt_length
        kept: list[Problem] = []
        long: list[tuple[Problem, int]] = []
        for p in problems:
            ids = problem_prompt_ids(self.tokenizer, p)
            if len(ids) > limit:
                long.append((p, len(ids)))
            else:
                self._prompt_ids[p.id] = ids
                kept.append(p)
        if long:
            first, n = long[0]
            log.warning("dropped %d of %d training problems whose prompt is over "
                        "magic.max_prompt_length=%d tokens (e.g. %s, %s: %d tokens)",
                        len(long), len(problems), limit, first.id, first.where, n,
                        extra={"dropped_long_prompts": len(long)})
        if problems and not kept:
            raise ValueError(f"every training prompt is over magic.max_prompt_length={limit} "
                             f"tokens (e.g. {long[0][0].id}: {long[0][1]} tokens)")
        return kept, len(long)

    # -- one step --------------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        """One MAGIC step, in named phases: generate and score the rollout batch, turn the
        verdicts into rewards and advantages (online filter), gather the batch statistics,
        update the policy, and sync the new weights into the rollout engine."""
        assert self.engine is not None and self.backend is not None
        t_step = time.monotonic()
        step = self.step + 1
        rollout = self._generate_and_score(step)
        scored = self._advantages(rollout)
        metrics = {mn.STEP: step, mn.STAGE: self.schedule.index,
                   mn.STAGE_MAX_RESPONSE_LENGTH: self.schedule.current.max_response_length}
        metrics.update(self._batch_metrics(rollout, scored))
        t0 = time.monotonic()
        metrics.update(self._update(step, rollout, scored, not metrics[mn.UPDATE_SKIPPED]))
        t_update = time.monotonic() - t0
        t0 = time.monotonic()
        if not metrics[mn.UPDATE_SKIPPED]:  # named_weights is a collective under ZeRO-3
            self.engine.load_weights(self.backend.named_weights())
        t_sync = time.monotonic() - t0
        metrics.update({mn.TIME_GENERATE: rollout.t_generate,
                        mn.TIME_VERIFY_WAIT: rollout.t_verify_wait,
                        mn.TIME_UPDATE: t_update, mn.TIME_SYNC: t_sync})
        self.step = step
        metrics[mn.TIME_STEP] = time.monotonic() - t_step
        # Stage transitions and logging must see the same numbers on every rank: rank 0's.
        return dist.broadcast(metrics)

    def _generate_and_score(self, step: int) -> "_Rollout":
        """Phase 1: sample this step's prompts, generate the groups, and stream each finished
        chunk to the verifier while generation goes on (docs/magic.md: verification must
        overlap generation); wait for the last verdicts."""
        cfg, m = self.cfg, self.cfg.magic
        # Every rank draws the same global prompts; its engine generates its rollout group's
        # share (the same on every rank of a tensor-parallel group, same seed), and the rank
        # keeps the part it owns (trainer/dist.py Layout).
        lay = self.layout
        global_problems = [self.train[i] for i in self.sampler.next(m.prompts_per_step)]
        rollout = lay.rollout_share(global_problems)
        problems = [p for i, p in enumerate(rollout) if lay.owns(i)]
        params = SamplingParams(n=m.group_size, temperature=m.temperature, top_p=m.top_p,
                                top_k=m.top_k, max_tokens=self.schedule.current.max_response_length,
                                seed=_seed(cfg, step, 0) + lay.group)

        def owned(chunk: list[Completion]) -> list[Completion]:
            """The completions this rank owns, renumbered into ``problems``."""
            return [dataclasses.replace(c, prompt_index=c.prompt_index // lay.tp) for c in chunk
                    if lay.owns(c.prompt_index)]

        def wire_id(c: Completion) -> str:
            return f"{step}:{self.rank}:{c.prompt_index}:{c.sample_index}"

        rewards_stream = RewardStream(self.client)

        def on_done(chunk: list[Completion]) -> None:
            rewards_stream.submit([problems[c.prompt_index].verifier_item(wire_id(c), c.text)
                                   for c in owned(chunk)])

        t0 = time.monotonic()
        self.engine.wake_up()
        try:
            completions = self.engine.generate([self.prompt_ids(p) for p in rollout], params,
                                               on_done=on_done if cfg.verifier.stream else None)
        except BaseException:
            rewards_stream.abort()
            raise
        self.engine.sleep()
        t_generate = time.monotonic() - t0
        if not cfg.verifier.stream:
            on_done(completions)
        completions = owned(completions)
        try:
            results, t_verify_wait = rewards_stream.wait(cfg.verifier.timeout_s)
        except RewardError as e:
            raise self._explain(e) from e
        ids = [wire_id(c) for c in completions]
        every = cfg.log.samples_every
        if self.rank == 0 and every and step % every == 0:
            write_samples(self.run_dir, step, sample_rows(step, problems, completions, results,
                                                          ids, cfg.log.samples_prompts))
        return _Rollout(problems, completions, ids, [results[i] for i in ids], t_generate,
                        t_verify_wait, rewards_stream.judged)

    def _advantages(self, rollout: "_Rollout") -> "_Scored":
        """Phase 2: verdicts to rewards, the online filter (and unjudged groups dropped when
        ``on_invalid_reward=drop_group``), and the group advantages."""
        cfg, m = self.cfg, self.cfg.magic
        judged = torch.tensor([r.status not in NOT_A_VERDICT for r in rollout.results])  # [N]
        if not bool(judged.all()) and cfg.on_invalid_reward == "fail":
            check_verdicts(dict(zip(rollout.ids, rollout.results, strict=True)))
        rewards = torch.tensor([r.reward for r in rollout.results], dtype=torch.float32)  # [N]
        truncated = torch.tensor([c.truncated for c in rollout.completions])  # [N]
        G = m.group_size
        keep = magic.filter_groups(rewards, G) if m.online_filter else torch.ones_like(judged)
        unjudged_groups = ~judged.view(-1, G).all(dim=1)  # [P]
        keep = keep & ~unjudged_groups.repeat_interleave(G)  # [N]
        adv = magic.group_advantages(rewards, G, truncated, m.mask_mode, m.adv_eps)  # [N]
        return _Scored(rewards, truncated, judged, keep, adv)

    def _batch_metrics(self, rollout: "_Rollout", scored: "_Scored") -> dict[str, Any]:
        """Phase 3: statistics over the whole rollout batch, gathered from every rank (a sync
        point: every rank must call it)."""
        G = self.cfg.magic.group_size
        no_answer = [r.status == Status.NO_ANSWER for r in rollout.results]
        stats = dist.gather(([rollout.problems[c.prompt_index].data_source
                              for c in rollout.completions],
                             [len(c.token_ids) for c in rollout.completions],
                             scored.rewards.tolist(), scored.truncated.tolist(),
                             scored.keep.tolist(), (~scored.judged).tolist(), no_answer,
                              [rollout.judged]))
        g_src, g_len, g_rew, g_trunc, g_keep, g_unj, g_none, g_sent = (
            sum((x[i] for x in stats), []) for i in range(8))
        metrics = _reward_metrics(g_src, g_len, torch.tensor(g_rew), torch.tensor(g_trunc), G)
        metrics[mn.REWARD_NO_ANSWER_FRAC] = sum(g_none) / len(g_none)
        metrics[mn.FILTERED_FRAC] = 1.0 - sum(g_keep) / len(g_keep)
        metrics[mn.REWARD_UNJUDGED] = int(sum(g_unj))
        metrics[mn.ROLLOUT_RESPONSES] = len(g_len)  # every rank's
        metrics[mn.ROLLOUT_JUDGED] = sum(g_sent)  # every rank's stream's distinct ones
        metrics[mn.UPDATE_SKIPPED] = int(sum(g_keep) == 0)  # the same answer on every rank
        return metrics

    def _update(self, step: int, rollout: "_Rollout", scored: "_Scored",
                any_kept: bool) -> dict[str, Any]:
        """Phase 4: the MAGIC update on the kept groups (off-policy mini-batches when the
        quadruple asks for them) and the entropy controller's move. ``any_kept``: some rank
        kept a group (the same answer on every rank: then all take part in the update)."""
        cfg, m = self.cfg, self.cfg.magic
        assert self.backend is not None
        G = m.group_size
        coef = self.controller.coef
        kept_prompts = torch.nonzero(scored.keep.view(-1, G).all(dim=1)).flatten()  # [P']
        if not any_kept:
            # Every group was filtered out: no update (MAGIC filters without refilling). The
            # keys stay (stable schema): no loss was applied, and entropy was not measured, so
            # the controller is not moved.
            metrics: dict[str, Any] = {mn.LOSS_POLICY: 0.0, mn.LOSS_CLIPFRAC: 0.0,
                                       mn.ENTROPY: None, mn.ENTROPY_ROLLOUT: None,
                                       mn.ENTROPY_COEF: coef,
                                       mn.ENTROPY_NEXT_COEF: coef}
            if m.keeps_reference:
                metrics[mn.LOSS_KL] = None  # not measured on this step
            return metrics
        rows = response_indices(kept_prompts, G)  # [P' * G]
        # A rank whose groups were all filtered still takes part in every collective of the
        # update: a one-row batch and empty mini-batches (the backend pads them).
        batch_rows = rows if rows.numel() else torch.zeros(1, dtype=torch.long)
        batch = TokenBatch.from_completions([rollout.completions[i] for i in batch_rows.tolist()],
                                            self.tokenizer.pad_token_id)
        gen = torch.Generator().manual_seed(_seed(cfg, step, 1) + self.rank)
        minibatches = [response_indices(p, G) for p in self.off_policy.minibatches(
            len(kept_prompts), gen, keep_empty=self.world > 1)]
        advantages = scored.advantages[batch_rows]  # [B], group advantages computed above
        budget = cfg.max_tokens_per_micro_batch
        if budget is not None and self.world > 1:
            # Collective (all-gather of every rank's kept rows): each mini-batch's rows are
            # dealt out again so that every rank computes about the same number of tokens.
            batch, advantages, minibatches = packing.rebalance(
                dist.gather(packing.rank_rows(batch, advantages, minibatches)), self.rank,
                self.tokenizer.pad_token_id)
        # On-policy (N_SGD = 1: one mini-batch, one step) the old policy is the current one:
        # the update takes the detached log-probs of its own forward (ratio exactly 1) and
        # the separate no-grad pass is skipped. A config property, so the same on every rank.
        old_logprobs = (None if self.off_policy.is_on_policy else
                        self.backend.logprobs(batch, cfg.micro_batch_size, response_only=True,
                                              temperature=m.temperature,
                                              max_tokens_per_micro_batch=budget))  # [B, T]
        loss = LossSettings(clip_low=m.clip_low, clip_high=m.clip_high, entropy_coef=coef,
                            kl_coef=m.kl_coef, kl_estimator=m.kl_estimator,
                            temperature=m.temperature)
        metrics = self.backend.update(batch, old_logprobs, advantages,
                                      UpdatePlan(minibatches, cfg.micro_batch_size, budget), loss)
        metrics[mn.ENTROPY_COEF] = coef
        metrics[mn.ENTROPY_NEXT_COEF] = self.controller.update(metrics[mn.ENTROPY])
        return metrics

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """avg@k on the held-out problems through the verifier: the same code as ``trainer
        eval`` (trainer/evaluation.py), so the numbers agree with ``verifier eval``."""

        e = self.cfg.eval
        assert self.engine is not None
        if not self.eval_problems:
            return {}
        t0 = time.monotonic()
        params = SamplingParams(n=e.n_samples, temperature=e.temperature, top_p=e.top_p,
                                top_k=-1,
                                max_tokens=e.max_tokens or self.schedule.max_response_length,
                                seed=_seed(self.cfg, self.step, 2))
        lay = self.layout
        probs = lay.rollout_share(self.eval_problems)  # each rank scores the part it owns
        engine = self.engine
        self.engine.wake_up()
        try:
            run = generate_and_score(engine, self.client, probs,
                                     [self.prompt_ids(p) for p in probs], params,
                                     timeout_s=self.cfg.verifier.timeout_s,
                                     after_generate=lambda _c: engine.sleep(), owns=lay.owns)
        except RewardError as err:
            engine.sleep()
            raise self._explain(err) from err
        except BaseException:
            engine.sleep()
            raise
        if self.world > 1:
            positions = [lay.global_index(k) for k in range(len(run.problems))]
            run = _merge_runs(dist.gather((positions, run.problems, run.results)))
        out = trainer_metrics(summarize_run(run, e.n_samples))  # RewardError if unjudged
        out[mn.TIME_EVAL] = time.monotonic() - t0
        return out

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train until total_steps; returns a summary. Ctrl-C (SIGINT) finishes the current
        step, writes a resumable checkpoint and returns; a second Ctrl-C aborts at once. A step
        or evaluation that cannot get its rewards (RewardError: e.g. the verifier unreachable
        for longer than ``verifier.outage_window_s``) stops the run: the last finished step is
        checkpointed first, then the error propagates."""
        cfg = self.cfg
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum: int, frame: Any) -> None:
            self._stop_requested = True
            signal.signal(signal.SIGINT, previous)  # a second Ctrl-C interrupts immediately
            log.warning("Ctrl-C: finishing this step, then writing a checkpoint")

        signal.signal(signal.SIGINT, on_sigint)
        first_eval: dict[str, float] = {}
        last_eval: dict[str, float] = {}
        try:
            if cfg.eval.every_steps and self.step == 0:
                first_eval = last_eval = self.evaluate()
                self._log({mn.STEP: 0, mn.STAGE: self.schedule.index, **first_eval})
            if self.logger is not None:
                self.logger.start_progress(cfg.total_steps, self.step)
            while self.step < cfg.total_steps and not dist.any_rank(self._stop_requested):
                drawn_before = self.sampler.state_dict()
                try:
                    metrics = self.train_step()
                except RewardError:
                    # Raised before the update: the model is the last finished step's. Its
                    # prompts are drawn again on resume, as an uninterrupted run would have.
                    self.sampler.load_state_dict(drawn_before)
                    self._checkpoint_before_stopping()
                    raise
                at_end = self.step == cfg.total_steps
                eval_error: RewardError | None = None
                if cfg.eval.every_steps and (self.step % cfg.eval.every_steps == 0 or at_end):
                    try:
                        last_eval = self.evaluate()
                        metrics.update(last_eval)
                    except RewardError as e:  # the step itself finished: logged and kept below
                        eval_error = e
                stage_ended = self.schedule.observe(self.step, metrics)
                self._log(metrics)
                if eval_error is not None:
                    self._checkpoint_before_stopping(keep=stage_ended)
                    raise eval_error
                if stage_ended:
                    names = [st.name for st in cfg.magic.stages]
                    log.info("%s ended at step %d; next: %s",
                             stage_label(self.schedule.index - 1, names), self.step,
                             stage_label(self.schedule.index, names),
                             extra={"step": self.step, "next_stage": self.schedule.index})
                    self.save_checkpoint(keep=True)
                elif (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or at_end:
                    self.save_checkpoint()
            if self.step < cfg.total_steps:  # stopped by Ctrl-C (on some rank)
                self.save_checkpoint()
        finally:
            signal.signal(signal.SIGINT, previous)
            if self.logger is not None:
                self.logger.stop_progress()
        summary = {"steps": self.step, "stage": self.schedule.index,
                   "interrupted": self.step < cfg.total_steps,
                   "eval_first": first_eval.get(mn.EVAL_ACCURACY),
                   "eval_last": last_eval.get(mn.EVAL_ACCURACY),
                   "run_dir": str(self.run_dir)}
        if cfg.log.plots and self.rank == 0:
            plot_run(self.run_dir)
        return summary

    def _log(self, metrics: dict[str, Any]) -> None:
        if self.logger is not None:
            self.logger.log(metrics)

    # -- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, keep: bool = False) -> Path:
        """Write checkpoints/step_NNNNNN atomically (a temporary directory renamed into place,
        then the ``latest`` pointer), so a crash never leaves a half-written checkpoint."""
        assert self.backend is not None
        root = self.run_dir / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        name = f"step_{self.step:06d}"
        tmp = root / f".{name}.tmp"
        final = root / name
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        dist.barrier()
        self.backend.save(tmp / "model")  # a collective: every rank writes its part
        dist.barrier()
        if self.rank == 0:
            self.tokenizer.save_pretrained(tmp / "model")
            state = {"step": self.step, "sampler": self.sampler.state_dict(),
                     "controller": self.controller.state_dict(),
                     "schedule": self.schedule.state_dict(), "keep": keep}
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            (root / "latest.tmp").write_text(name)
            (root / "latest.tmp").rename(root / "latest")
            self._prune(root)
            log.info("checkpoint of step %d saved: %s", self.step, final,
                     extra={"step": self.step, "path": str(final)})
        dist.barrier()
        return final

    def _checkpoint_before_stopping(self, keep: bool = False) -> None:
        """A verifier failure is about to stop the run: checkpoint the last finished step (when
        it is not the latest checkpoint already) so that ``--resume`` continues from it. A
        failure to write it is logged; the verifier's error is the one the run reports."""
        latest = self.latest_checkpoint()
        if self.step == 0 or (latest is not None and latest.name == f"step_{self.step:06d}"):
            return
        if self.world > 1:
            # A checkpoint is a collective: the other ranks may be in another one (their own
            # rewards came back), so waiting for them here could hang the job instead of ending it.
            log.warning("the verifier failed: no checkpoint of step %d with %d ranks (latest: "
                        "%s)", self.step, self.world, latest)
            return
        try:
            path = self.save_checkpoint(keep=keep)
        except Exception as e:  # noqa: BLE001 - the verifier's error stops the run, not this one
            log.error("could not write a checkpoint of step %d before stopping: %s", self.step, e)
            return
        log.warning("the verifier failed: wrote a checkpoint of step %d before stopping (%s)",
                    self.step, path)

    def _prune(self, root: Path) -> None:
        steps = sorted(p for p in root.glob("step_*") if p.is_dir())
        plain = [p for p in steps
                 if not json.loads((p / STATE_FILE).read_text()).get("keep")]
        for p in plain[: max(0, len(plain) - self.cfg.keep_checkpoints)]:
            shutil.rmtree(p, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        pointer = self.run_dir / "checkpoints" / "latest"
        if not pointer.exists():
            return None
        path = pointer.parent / pointer.read_text().strip()
        return path if (path / STATE_FILE).exists() else None

    def _restore(self, ckpt: Path) -> None:
        assert self.backend is not None
        self.backend.load(ckpt / "model")
        state = json.loads((ckpt / STATE_FILE).read_text())
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.controller.load_state_dict(state["controller"])
        self.schedule.load_state_dict(state["schedule"])
        log.info("resumed", extra={"checkpoint": str(ckpt), "step": self.step})

    def close(self) -> None:
        """Close the engine, the backend (its process group, when it made one), the verifier
        connection (and the local verifier) and the logger; safe to call twice."""
        for attr in ("engine", "backend"):
            obj = getattr(self, attr, None)
            if obj is not None:
                obj.close()
                setattr(self, attr, None)
        if self._verifier is not None:  # the client, and the local verifier if we started it
            self._verifier.__exit__(None, None, None)
            self._verifier = None
        self.client = None
        if getattr(self, "logger", None) is not None:
            self.logger.close()


@dataclass
class _Rollout:
    """A rank's share of one step's rollout batch, in group order (G responses per prompt)."""

    problems: list[Problem]
    completions: list[Completion]  # [N]
    ids: list[str]  # [N] the verifier items' ids
    results: list[Any]  # [N] verifier Results, aligned with completions
    t_generate: float
    t_verify_wait: float
    judged: int  # items the verifier judged (verifier.dedupe: the others copy one of them)


@dataclass
class _Scored:
    rewards: torch.Tensor  # [N] float
    truncated: torch.Tensor  # [N] bool
    judged: torch.Tensor  # [N] bool: the verifier gave a verdict
    keep: torch.Tensor  # [N] bool: online filter and unjudged groups
    advantages: torch.Tensor  # [N]


def _merge_runs(parts: list[tuple[list[int], list[Any], dict[str, Any]]]) -> Any:
    """One ScoredRun from every rank's (global positions, problems, results): problems
    renumbered to their global position, results re-keyed to match."""

    problems: list[Any] = []
    results: dict[str, Any] = {}
    for positions, probs, res in parts:
        for pos, p in zip(positions, probs, strict=True):
            q = dataclasses.replace(p, line=pos + 1)
            for j in range(len(p.responses)):
                results[q.wire_id(j)] = res[p.wire_id(j)]
            problems.append(q)
    problems.sort(key=lambda p: p.line)
    return ScoredRun(problems, results, [], 0.0, 0.0)


def _reward_metrics(sources: list[str], lengths: list[int], rewards: torch.Tensor,
                    truncated: torch.Tensor, G: int) -> dict[str, float]:
    """Batch statistics; ``rewards`` [N] and ``truncated`` [N] are grouped by prompt."""
    out = {mn.REWARD_MEAN: float(rewards.mean()),
           mn.RESPONSE_LENGTH_MEAN: sum(lengths) / len(lengths),
           mn.RESPONSE_LENGTH_MAX: max(lengths),
           mn.TRUNCATED_FRAC: float(truncated.float().mean()),
           mn.REWARD_SOLVE_NONE_FRAC: float((rewards.view(-1, G).max(dim=1).values == 0).float().mean()),
           mn.REWARD_SOLVE_ALL_FRAC: float((rewards.view(-1, G).min(dim=1).values == 1).float().mean())}
    by_src: dict[str, list[float]] = defaultdict(list)
    for src, r in zip(sources, rewards.tolist()):
        by_src[src or "default"].append(r)
    for src, rs in by_src.items():
        out[mn.reward_by_source(src)] = sum(rs) / len(rs)
    return out


def _yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False)

