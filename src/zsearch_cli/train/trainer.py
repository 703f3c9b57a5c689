"""The one RL loop every ``--algo`` runs (cleanrl/TRL style: ``TrainConfig`` + ``Trainer``).

Each step (counted from 1): ``search.progress(steps done, T)`` → rollout (G samples per
prompt through the shared engine, typed ``Trajectory`` records) → reward → (DSPO) filter →
one padded ``StepBatch`` → old/ref logprobs and values under no_grad → advantages
(``AlgoSpec``, grouped by each sample's group key) → K epochs of mini-batches → lr schedule
step → metrics (``rollout/…``, ``actor/…``, …), and every ``save_every`` steps an
exact-resume checkpoint. The algorithm itself lives in
``algos/`` (pure maths); this file only moves tensors between the pieces.

Scale: the model, optimizer, backward, clipping and no_sync go through
``accelerate.Accelerator``, so ``accelerate launch -m zsearch_cli.cli train ...`` runs one
process per device, each rolling out its slice of every batch. Tested on CPU: one process,
and DDP over 2 processes (gloo); checkpoints gather FSDP / ZeRO-3 shards (checkpoint.py).
"""

from __future__ import annotations

import os
import random
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from zsearch_cli.algos import AlgoConfig, AlgoSpec
from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import ProgressLines, Stopped, active_stop, heartbeat, progress_bar
from zsearch_cli.train.signals import abandon_step, abandonable, process_snapshot, stop_between_steps, watch_steps
from zsearch_cli.train.balance import Balancer
from zsearch_cli.models.base import logp_tolerance
from zsearch_cli.search.base import SearchBackend
from zsearch_cli.train.checkpoint import (atomic_dir, full_model_state, load_training_state, save_checkpoint,
                                          TrainingState)
from zsearch_cli.train.step_samples import BatchRewardFn, RewardFn, Sample, sample_step
from zsearch_cli.train.config import (TrainConfig, check_config, check_processes, get_spec, resolve_config, resolved_dict,
                                     search_options)
from zsearch_cli.train.sampler import PromptSampler, load_rows
from zsearch_cli.train.metrics import (MetricsLog, average_over_processes, check_logp_mismatch, console_line,
                                      step_metrics)
from zsearch_cli.train.policy import (generation_backend, load_critic, load_policy, load_reference,
                                      merged_weights, save_merged, save_policy, sync_generation_copy,
                                      unsharded_loading)
from zsearch_cli.train.optim import make_optimizer
from zsearch_cli.train.stability import KEEP_HEALTHY, Stability
from zsearch_cli.train.update import (StepModels, advantages, optimize, rollout_tensors, sample_advantages,
                                      step_batch)
from zsearch_cli.train.setup import agreed_layout, make_accelerator, resume_hint, resume_point
from zsearch_cli.train.validation import Validator

SYNC_PROBE = ("Question: who wrote the novel pride and prejudice? <think> I need to search. </think> "
              "<search> author of pride and prejudice </search> <answer> Jane Austen </answer>")
"""Text whose logprobs the vLLM engine and the policy must agree on after each weight sync."""


class Trainer:
    """Build with a :class:`TrainConfig`, then :meth:`train`. ``search`` and ``reward_fn``
    replace the configured search backend / reward (tests, and stages with their own).

    Stages that generate their own prompts and score whole batches (``zsearch propose``:
    HRPO on the Dr. Zero proposer) pass ``data`` — anything with ``next_batch()``,
    ``batch_size``, ``state()`` and ``load_state()``, checkpointed like the QA cursor — and
    ``batch_reward_fn`` (see :data:`~zsearch_cli.train.step_samples.BatchRewardFn`), which also
    supplies the group keys of an algorithm whose groups are not prompts
    (``AlgoSpec.batch_reward``).

    ``stop`` (set by ``zsearch train``: a :class:`~zsearch_cli.progress.StopSignals`) makes a
    SIGTERM / SIGINT abandon the running step and write the last completed one when a
    checkpoint is due (train/signals.py)."""

    stop: Any = None
    lines: ProgressLines | None = None
    abandons_steps = False
    """A signal abandons the running step (train/signals.py): one process, or DDP's main process."""
    committed = False
    """The running step has made an optimizer step: its weights are no longer the last completed step's."""

    def __init__(self, cfg: TrainConfig, *, search: SearchBackend | None = None, reward_fn: RewardFn | None = None,
                 console: Console | None = None, data: Any = None, batch_reward_fn: BatchRewardFn | None = None):
        self.acfg: AlgoConfig = check_config(cfg)
        # From here on every "paper default" is the value in use: logged, checkpointed, compared on resume.
        self.cfg: TrainConfig = resolve_config(cfg)
        cfg = self.cfg
        self.spec: AlgoSpec = get_spec(cfg.algo)
        if self.spec.batch_reward is not None and batch_reward_fn is None:
            raise ZsearchError(f"--algo {cfg.algo}: {self.spec.batch_reward}")
        self.reward_fn = reward_fn
        self.batch_reward_fn = batch_reward_fn
        self.console = console or Console(stderr=True)
        self.accelerator = make_accelerator(cfg, self.spec)
        resume_dir = resume_point(cfg, self.accelerator, self.console)
        self.data = data if data is not None else PromptSampler(load_rows(cfg.train_data), cfg.batch_size, cfg.seed)
        self.validator = Validator.from_config(cfg)  # reads --val-data now, before any model loads
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        device = str(self.accelerator.device)
        self.policy, self.tokenizer = load_policy(cfg, device, cfg.policy.dtype, resume_dir)
        with unsharded_loading(self.accelerator):  # the reference is never prepared: every process holds it whole
            self.reference = load_reference(cfg, self.policy, device, cfg.policy.dtype, self.spec.needs_reference(self.acfg))
        self.critic = load_critic(cfg, device, cfg.policy.dtype, resume_dir) if self.spec.needs_critic else None
        sched = (cfg.steps, cfg.optim.warmup_ratio, cfg.optim.lr_schedule, cfg.optim.min_lr_ratio)
        self.optimizer, self.scheduler = make_optimizer(self.policy.parameters(), cfg.optim.lr, cfg.optim.weight_decay, *sched)
        self.critic_optimizer = self.critic_scheduler = None
        if self.critic is not None:
            self.critic_optimizer, self.critic_scheduler = make_optimizer(
                self.critic.parameters(), cfg.critic_lr, cfg.optim.weight_decay, *sched)
            self.critic, self.critic_optimizer = self.accelerator.prepare(self.critic, self.critic_optimizer)
        self.policy, self.optimizer = self.accelerator.prepare(self.policy, self.optimizer)

        if search is None:
            from zsearch_cli.search.factory import make_search_backend

            # --noise-* and the seed, for the simulator (search_options checked them already)
            search = make_search_backend(cfg.retrieval.search, index_dir=cfg.retrieval.index or Path("runs/index"), **search_options(cfg))
        self.search: SearchBackend = search
        self.generation, self.generation_copy = generation_backend(cfg, self.accelerator, self.policy,
                                                                   self.tokenizer, resume_dir)
        from zsearch_cli.models.hf import HFBackend

        self.uses_vllm = not isinstance(self.generation, HFBackend)
        from zsearch_cli.rollout.build import build_engine

        self.engine = build_engine(cfg, backend=self.generation, search=self.search,
                                   seed=cfg.seed + 7919 * self.accelerator.process_index)
        if self.validator is not None:
            self.validator.attach(self.generation, self.search, self.accelerator, cfg.batch_size * cfg.group_size)
        self.metrics = MetricsLog(Path(cfg.run.out), resolved_dict(cfg, self.accelerator.num_processes), self.accelerator,
                                  self.accelerator.is_main_process)
        self.stability = (Stability(cfg.run.out, cfg.collapse.on_collapse, self.console, self.accelerator.is_main_process,
                                    self.metrics.config) if cfg.collapse.guard else None)  # the collapse guard (stability.py)
        self.start_step = 0
        self.overlap = None  # --rollout-overlap: the stream and the rows drawn ahead, while train() runs
        if resume_dir is not None:
            state = load_training_state(self.training_state(), resume_dir,
                                        note=lambda text: self.console.print(f"[yellow]{text}[/]", soft_wrap=True))
            self.start_step = int(state["step"])
            self.metrics.restore(state["metrics"])
            if self.stability is not None:
                self.stability.load_state(state.get("guard"), self.start_step)
            if self.accelerator.is_main_process:
                self.console.print(f"resuming from {resume_dir} (step {self.start_step}/{cfg.steps})", soft_wrap=True)
        else:
            self.metrics.start_fresh()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.models = StepModels(self.policy, self.reference, self.critic, self.optimizer, self.critic_optimizer,
                                 self.accelerator, int(self.pad_id), self.accelerator.device,
                                 layout=agreed_layout(cfg, self.policy, self.accelerator, self.console))
        self.sync_generation()

    def _all_counts(self, n: int) -> list[int]:
        """Every process's ``n``, in rank order (a collective)."""
        from accelerate.utils import gather_object

        return [int(x) for x in gather_object([n])]

    def sync_generation(self) -> None:
        """Make the generation backend see the current policy: push it (LoRA merged) into the
        vLLM engine and check the engine now scores a fixed probe like the policy does, or
        refresh the HF backend's copy under FSDP / ZeRO-3; the HF backend of one process or
        DDP shares the policy object and needs nothing."""
        if self.uses_vllm:
            policy = self.accelerator.unwrap_model(self.policy)
            self.generation.update_weights(merged_weights(policy))
            self.sync_mismatch = self.worst_over_processes(self._probe_mismatch(policy))
            tol = logp_tolerance(self.generation.dtype)
            if self.sync_mismatch > tol:
                raise ZsearchError(f"the vLLM weight sync failed: after it, the engine's logprobs of a probe "
                                   f"sequence differ from the policy's by up to {self.sync_mismatch:.2e} nats "
                                   f"(tolerance {tol:.0e} for {str(self.generation.dtype).removeprefix('torch.')}); rollouts would not come "
                                   "from the weights being trained")
        elif self.generation_copy is not None:
            sync_generation_copy(self.accelerator, self.policy, self.generation_copy)

    def worst_over_processes(self, value: float) -> float:
        """The largest ``value`` of all processes (a collective; itself on one process), so that
        a guard on it stops every process together instead of leaving the others to hang."""
        if self.accelerator.num_processes == 1:
            return value
        worst = torch.tensor([value], dtype=torch.float64, device=self.accelerator.device)
        torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
        return float(worst.item())

    def _probe_mismatch(self, policy: Any) -> float:
        """max |engine − policy| logprob over a fixed probe sequence (raw log-softmax both)."""
        probe = self.tokenizer.encode(SYNC_PROBE, add_special_tokens=False)
        engine = torch.tensor(self.generation.sequence_logprobs(probe))
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad():
                ids = torch.tensor([probe], device=self.accelerator.device)
                logp = policy(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
        finally:
            policy.train(was_training)
        ours = logp.gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()
        return float((engine - ours).abs().max())

    def close(self) -> None:
        """Release the generation engine (vLLM's holds a KV cache and a process group)."""
        if self.uses_vllm:
            self.generation.close()

    # ------------------------------------------------------------------ the loop

    def train_step(self, step: int) -> dict[str, Any]:
        """Step ``step`` (1-based: the first step is 1, as in the console, the metrics, the
        rollouts and ``checkpoints/step-N``); returns its metrics row (already logged)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        done = step - 1  # steps before this one: what the curriculum and the seeds count
        with abandonable(self, step):  # a signal abandons all of this (train/signals.py)
            self.search.progress(done, cfg.steps)  # the simulator's noise curriculum reads it
            acc = self.accelerator
            if self.overlap is not None:  # rows drawn and rolled out ahead (train/overlap.py)
                self.overlap.fill(step)
                engine, data = self.overlap, self.overlap
            else:
                self.engine.policy_version = done
                engine, data = self.engine, self.data
            self._phase(f"rolling out step {step}/{cfg.steps}")
            collected = sample_step(engine, data, self.spec, self.acfg, step, group_size=cfg.group_size,
                                    metric=cfg.reward, protocol=cfg.rollout.protocol, format_bonus=cfg.format_bonus,
                                    reward_fn=self.reward_fn, shard=(acc.process_index, acc.num_processes),
                                    batch_reward_fn=self.batch_reward_fn,
                                    all_counts=self._all_counts if acc.num_processes > 1 else None)
            for note in collected.notes:
                self.console.print(f"[yellow]{note}[/]", soft_wrap=True)
            t1 = time.perf_counter()
            update: dict[str, float] | None = None
            mismatch = sync_time = staleness = None
            validation: dict[str, Any] = {}
            train = collected.train
            if train:
                self._phase(f"updating on step {step}/{cfg.steps}")
                if cfg.run.vllm_sleep and self.uses_vllm:
                    # The update gets the engine's GPU memory; the weight sync after it wakes the engine
                    # (VLLMBackend.update_weights: weights, sync, KV cache) before anything generates.
                    self.generation.sleep()
                self.policy.train()
                balancer = Balancer(acc, cfg.batch.balance_tokens)  # the prompt groups dealt by tokens (train/balance.py)
                dealt = balancer.deal(train)
                batch = rollout_tensors(self.models, step_batch(dealt.samples, self.models.pad_id), cfg, version=done)
                batch = advantages(self.spec, self.acfg, batch, self.accelerator)
                for sample, a in zip(train, balancer.home(sample_advantages(batch), dealt, len(train))):
                    sample.advantage = a
                update = optimize(self.models, self.spec, self.acfg, cfg, batch, done)
                mismatch = batch.logp_mismatch
                sampled = batch.tokens.mask.bool()
                staleness = float((done - batch.versions[sampled]).float().mean()) if sampled.any() else None
            t_sync = time.perf_counter()
            if self.overlap is not None:
                # New weights (and validation) where no request is generating: on the rollout thread.
                self.overlap.stream.update(step, push=lambda: self._refresh(step, bool(train), validation))
            else:
                self._refresh(step, bool(train), validation)
            if train and (self.uses_vllm or self.overlap is not None):
                sync_time = time.perf_counter() - t_sync
        lr = self.scheduler.get_last_lr()[0]  # the lr this step's updates used
        critic_lr = self.critic_scheduler.get_last_lr()[0] if self.critic_scheduler is not None else None
        with warnings.catch_warnings():  # a DSPO step with nothing kept steps the lr without an update
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
            if self.critic_scheduler is not None:
                self.critic_scheduler.step()
        now = time.perf_counter()
        extra = {"actor/lr": lr, "critic/lr": critic_lr, "rollout/logp_mismatch": mismatch,
                 "rollout/sync_mismatch": self.sync_mismatch if self.uses_vllm and train else None,
                 "rollout/staleness": staleness if cfg.rollout_overlap else None,
                 "time/update": now - t1, "time/step": now - t0, "time/sync": sync_time,
                 **{f"search/{k}": v for k, v in self.search.metrics().items()}, **collected.reward_metrics}
        extra.update(validation)  # val/em, val/f1, val/subem of the updated policy
        row = self._reduce(step_metrics(step, collected, update, extra))
        if self.stability is not None:  # adds guard/events and guard/rollbacks, logs events, decides
            self.stability.observe(step, row)
        if cfg.run.save_rollouts:
            self._save_rollouts(step, collected.samples)
        self.metrics.log(row)
        dtype = (self.generation.dtype if self.uses_vllm
                 else next(self.accelerator.unwrap_model(self.policy).parameters()).dtype)
        check_logp_mismatch(row, dtype)
        return row

    def _refresh(self, step: int, updated: bool, validation: dict[str, Any]) -> None:
        """After step ``step``'s update: the generation backend gets the new weights, then
        validation runs when due (its metrics go into ``validation``). Both need the backend
        idle, so under --rollout-overlap this runs on the rollout thread, between two turns."""
        if updated:
            self.sync_generation()
        if self.validator is not None and self.validator.due(step):
            validation.update(self.validator.run(step))

    def _reduce(self, row: dict[str, Any]) -> dict[str, Any]:
        """Average each metric over processes (a no-op on one process): one gather of the
        whole rows (train/metrics.py: average_over_processes says why)."""
        if self.accelerator.num_processes == 1:
            return row
        from accelerate.utils import gather_object

        return average_over_processes(gather_object([row]))

    def _save_rollouts(self, step: int, samples: list[Sample]) -> None:
        from zsearch_cli.artifacts import write_artifact
        from zsearch_cli.schemas import ROLLOUT

        rows = [s.to_row() for s in samples]
        suffix = f".rank{self.accelerator.process_index}" if self.accelerator.num_processes > 1 else ""
        write_artifact(rows, Path(self.cfg.run.out) / "rollouts" / f"step-{step:06d}{suffix}.parquet", ROLLOUT,
                       self.cfg.to_dict())

    def training_state(self) -> TrainingState:
        """What a checkpoint saves and restores (train/checkpoint.py)."""
        return TrainingState(self.accelerator, self.cfg, self.policy, self.tokenizer, self.optimizer, self.scheduler,
                             self.overlap or self.data, self.metrics.rows, self.critic, self.critic_optimizer, self.critic_scheduler,
                             self.stability.state_dict() if self.stability is not None else None)

    def checkpoint(self, completed: int, snapshot: dict[str, Any] | None = None) -> Path:
        """Save OUT/checkpoints/step-``completed`` and the Parquet metrics. Every process calls
        it (FSDP / ZeRO-3 shards are gathered); the main process writes. ``snapshot``: an
        abandoned step's generators and data cursor as it began (train/signals.py); only the
        process that abandoned it calls it then."""
        guard = self.stability
        state = self.training_state()
        state.snapshot = snapshot
        with self.stop.deferred() if self.stop is not None else nullcontext():  # no half-written folder
            path = save_checkpoint(state, completed, guard.protected() if guard else (), KEEP_HEALTHY if guard else 0)
        self.saved_step = completed
        if guard is not None:
            guard.saved(completed)
        self.metrics_written()
        return path

    def metrics_written(self) -> None:
        """OUT/metrics.parquet holds every step logged so far (the main process writes it)."""
        if self.accelerator.is_main_process:
            self.metrics.write_parquet()

    def save_final(self) -> Path:
        """OUT/final: an HF model folder (or LoRA adapter) that ``zsearch eval --model`` loads.
        Every process calls it: the weights are gathered from all, the main process writes."""
        acc = self.accelerator
        final = Path(self.cfg.run.out) / "final"
        state = full_model_state(acc, self.policy)
        if acc.is_main_process:
            atomic_dir(final, lambda tmp: save_policy(acc.unwrap_model(self.policy), self.tokenizer, tmp,
                                                      self.cfg.policy.model, state))
            save_merged(final, self.cfg)  # --merge-lora: OUT/final/merged
        acc.wait_for_everyone()  # OUT/final is complete before any process returns it
        return final

    def train(self) -> Path:
        """Run the remaining steps; returns the final model folder."""
        cfg = self.cfg
        columns = (TextColumn("[bold]train {task.fields[algo]}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("reward {task.fields[reward]}"), TextColumn("{task.fields[sps]} s/step"),
                   TimeElapsedColumn())
        show = self.accelerator.is_main_process
        watch_steps(self)
        if cfg.rollout_overlap:
            self._start_overlap()
        try:
            self._steps(columns, show)
        except Stopped as stopped:  # a SIGTERM / SIGINT (train/signals.py): release the engine, no final
            if stopped.hard_exit:  # threads of the abandoned step may be blocked: do not wait for them
                self.overlap = None
                self.close()
                raise
            if self.overlap is not None:
                self.overlap.stream.close()
                self.overlap = None
            self.close()
            self.accelerator.end_training()
            raise
        finally:
            if self.overlap is not None:
                self.overlap.stream.close()
                self.overlap = None
        final = self.save_final()
        if show:
            self.metrics.write_parquet()
            self.console.print(f"final model written to {final} (zsearch eval --model {final})", soft_wrap=True)
        self.close()  # before end_training: it destroys the process group the vLLM engine uses
        self.accelerator.end_training()
        return final

    def _start_overlap(self) -> None:
        from zsearch_cli.rollout.stream import RolloutStream
        from zsearch_cli.train.overlap import OverlapSource

        self.engine.policy_version = self.start_step  # the weights the engine holds now
        stream = RolloutStream(self.engine, self.cfg.group_size)
        self.overlap = OverlapSource(stream, self.data, self.cfg.rollout_overlap, self.cfg.steps)

    def _steps(self, columns: tuple, show: bool) -> None:
        cfg = self.cfg
        # a log file gets plain lines (rich draws no bar there): progress.py
        lines = ProgressLines(f"train {cfg.algo}", cfg.steps, "steps", done=self.start_step, enabled=None if show else False)
        with progress_bar(*columns, console=self.console, disable=not show) as bar, lines:
            self.lines = lines
            task = bar.add_task("train", total=cfg.steps, completed=self.start_step, algo=cfg.algo, reward="-", sps="-")
            step = self.start_step  # 1-based; start_step steps are done
            while step < cfg.steps:
                stop_between_steps(self, step)
                step += 1
                snapshot = process_snapshot(self.overlap or self.data) if self.abandons_steps else None
                self.committed = False
                try:
                    row = self.train_step(step)
                except Stopped as stopped:
                    if not stopped.abandoned:
                        raise
                    raise abandon_step(self, step, stopped.signum, snapshot, self.committed) from None
                except ZsearchError as err:  # e.g. the retriever died: say which step, and how to go on
                    err.args = (f"{err.args[0] if err.args else err} (in step {step}/{cfg.steps}; "
                                f"{resume_hint(Path(cfg.run.out))})",)
                    raise
                self._phase("")
                lines.advance(1, reward=row["rollout/reward_mean"])
                bar.update(task, advance=1, reward=f"{row['rollout/reward_mean']:.3f}", sps=f"{row['time/step']:.1f}")
                if show:
                    bar.console.print(console_line(row, cfg.steps), highlight=False, soft_wrap=True)
                if self.stability is not None and self.stability.decision is not None:
                    back = self.stability.act(self, step, self.metrics)  # a stop raises
                    if back is not None:  # rolled back to checkpoint `back`: go on from there
                        step = back
                        bar.update(task, completed=back)
                        continue
                if cfg.run.save_every and step % cfg.run.save_every == 0:
                    self.checkpoint(step)
        self.lines = None

    def _phase(self, text: str) -> None:
        if self.lines is not None:
            self.lines.phase(text)

def run_training(cfg: TrainConfig, stop: Any = None, **kwargs: Any) -> Path:
    """Library entry point behind ``zsearch train``: build a Trainer and train it (``stop``:
    see :class:`Trainer`)."""
    from zsearch_cli.models.loading import check_model_early

    main = os.environ.get("RANK", "0") == "0"  # under accelerate launch: one process prints
    # the cheap refusals first, then the model's files, all before the loading line (issue 36.7)
    check_config(cfg)
    check_processes(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    check_model_early(cfg.policy.model)
    stop = stop if stop is not None else active_stop()  # zsearch train / solve install one
    # one process: a signal abandons the loading too (several would leave the others in a collective)
    alone = stop is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1
    try:
        with heartbeat("train", f"loading {cfg.policy.model} and the data", enabled=None if main else False), \
                stop.abandonable() if alone else nullcontext():
            trainer = Trainer(cfg, **kwargs)
    except Stopped as stopped:
        if not stopped.abandoned:
            raise
        raise Stopped(stopped.signum, f"train: {stopped.name} while loading, before any step: nothing was written; "
                      "rerun the same command", hard_exit=True) from None
    trainer.stop = stop
    return trainer.train()
