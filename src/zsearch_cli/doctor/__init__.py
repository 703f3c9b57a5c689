"""``zsearch doctor``: the self-check a user runs on their own hardware before training.

Each check is a library function returning a :class:`~zsearch_cli.doctor.results.CheckResult`:

- ``environment.check_environment``: versions, devices, free memory, disk;
- ``parity.check_parity``: the engine's sampled logprobs against the trainer's forward;
- ``sync.check_weight_sync``: a perturbed policy reaches the engine through the trainer's sync;
- ``template.check_chat_template``: the engine's token stream against the chat template;
- ``load.check_retrieval_load``: the search backend at the training's concurrency.

``run.run_doctor`` runs those ``--checks`` names; docs/commands/doctor.md says what each proves and
why its thresholds are what they are.
"""
