"""The ``zsearch`` command line: one thin typer command per stage.

Commands parse options and call library functions; all logic lives in the modules.
"""

from __future__ import annotations

import typer

from zsearch_cli import __version__, cli_audit, cli_doctor, cli_drzero, cli_train
from zsearch_cli.cli_options import command
from zsearch_cli.config.fields import build
from zsearch_cli.cli_base import OneLineErrors, resolved_options, show_ranges_in_help
from zsearch_cli.config.commands import (AgentServeOptions, CollectOptions, EvalOptions, IndexOptions, JudgeOptions,
                                         QueryOptions, ServeOptions, ShowOptions)

app = typer.Typer(
    name="zsearch",
    help="Train LLM search agents: Search-R1, ZeroSearch, DSPO and Dr. Zero as composable stages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts are plain text: with rich markup on, "[whole batch]" or "[algo default 1e-6]"
    # would be parsed as a style tag and silently vanish from --help.
    rich_markup_mode=None,
    cls=OneLineErrors,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"zsearch {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """zsearch: index, search, roll out, train and evaluate search agents."""


# ----------------------------------------------------------------------------- index / search / serve / show


@app.command()
@command(IndexOptions, name="index")
def index(ctx: typer.Context, given: dict) -> None:
    """Build a BM25 and/or dense index over a corpus."""
    from zsearch_cli.retrieval.index import build_index

    opts = build(IndexOptions, given)
    typer.echo(f"index written to {build_index(opts.corpus, opts.out, options=resolved_options(ctx))}")


@app.command()
@command(ShowOptions, name="show", config_file=False)
def show(ctx: typer.Context, given: dict) -> None:
    """Print trajectories turn by turn: reasoning, queries, retrieved titles, answer, gold, reward."""
    from zsearch_cli.commands.show import show as show_trajectories

    opts = build(ShowOptions, given)
    show_trajectories(opts.file, opts.ids or (), opts.where, opts.limit)


@app.command()
@command(QueryOptions, name="search")
def search(ctx: typer.Context, given: dict) -> None:
    """Search an index (or any --search backend) and print the top-k as a table (for humans)."""
    o = build(QueryOptions, given)
    if o.search is None:
        from zsearch_cli.retrieval.index import print_search

        print_search(o.query, o.retrieval.index, method=o.retrieval.method, topk=o.topk or 3)
    elif o.search.strip().startswith(("sim:", "sim+")):
        from zsearch_cli.search.show import print_simulation

        print_simulation(o.search.strip(), o.query, o.question or o.query, o.answer or [], o.quality, o.topk or 5,
                         mode=o.sim_mode, model=o.sim_model)
    else:
        from zsearch_cli.search.show import print_backend_search

        print_backend_search(o.search, o.query, o.retrieval.index, o.topk or 3, o.question, o.answer or [])


@app.command()
@command(ServeOptions, name="serve")
def serve(ctx: typer.Context, given: dict) -> None:
    """Serve an index, replicas, SerpAPI or the ZeroSearch simulator over HTTP with Search-R1's /retrieve API."""
    from zsearch_cli.commands.serve import plan_from_options, serve as run_serve

    run_serve(plan_from_options(build(ServeOptions, given)))


# ----------------------------------------------------------------------------- eval


@app.command("eval")
@command(EvalOptions, name="eval")
def eval_(ctx: typer.Context, given: dict) -> None:
    """Evaluate a model (EM, F1, subEM) per dataset, or score a predictions file."""
    from zsearch_cli.commands.eval_predictions import score_predictions
    from zsearch_cli.commands.evaluate import evaluate

    opts, options = build(EvalOptions, given), resolved_options(ctx)
    if opts.predictions is not None:
        score_predictions(opts.predictions, opts.qa, opts.out, options, opts.data.group_by, opts.pooled)
    else:
        evaluate(opts, options)


# ----------------------------------------------------------------------------- Dr. Zero

# propose (HRPO training / --generate-only), solve and drzero live in cli_drzero.py (length only).
# short_help: click ends a command's one-line help at the first ". ", which is "Dr." here
app.command(short_help="Dr. Zero proposer: HRPO training against a frozen solver, or --generate-only.")(
    cli_drzero.propose)
app.command(short_help="Dr. Zero solver: GRPO on a proposer-generated QA set.")(cli_drzero.solve)
app.command(short_help="Dr. Zero self-evolution: propose, generate, solve (, eval) per iteration.")(
    cli_drzero.drzero)


# ----------------------------------------------------------------------------- ZeroSearch data: collect / judge


@app.command()
@command(CollectOptions, name="collect")
def collect(ctx: typer.Context, given: dict) -> None:
    """Collect agent trajectories against a real search engine and their query-document rows."""
    from zsearch_cli.commands.collect import collect as run_collect

    run_collect(build(CollectOptions, given), resolved_options(ctx))


@app.command()
@command(JudgeOptions, name="judge")
def judge(ctx: typer.Context, given: dict) -> None:
    """Label each collected query's documents useful or noisy with an LLM judge (ZeroSearch §3.3)."""
    from zsearch_cli.commands.judge import judge as run_judge

    run_judge(build(JudgeOptions, given), resolved_options(ctx))


# ----------------------------------------------------------------------------- training

# train, plot, warmup-data, sft and simsft live in cli_train.py (length only).
app.command()(cli_train.train)
app.command()(cli_train.plot)
app.command()(cli_train.export)
app.command("warmup-data")(cli_train.warmup_data)
app.command()(cli_train.sft)
app.command()(cli_train.simsft)
app.command()(cli_audit.audit)  # cli_audit.py (length only)
app.command()(cli_doctor.doctor)  # cli_doctor.py (length only)


# ----------------------------------------------------------------------------- agent


class _AgentGroup(typer.core.TyperGroup):
    """``zsearch agent``: its commands' ranges are registered as ``agent NAME``."""

    def __init__(self, **kwargs: object):
        super().__init__(**kwargs)
        show_ranges_in_help(self.commands, prefix="agent ")


agent_app = typer.Typer(name="agent", help="Serve a trained search agent.", no_args_is_help=True,
                        add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None, cls=_AgentGroup)
app.add_typer(agent_app, name="agent")


@agent_app.command("serve")
@command(AgentServeOptions, name="agent serve")
def agent_serve(ctx: typer.Context, given: dict) -> None:
    """Serve the search agent (the eval engine: search, read, answer) over an OpenAI-compatible
    /v1/chat/completions API."""
    from zsearch_cli.agent.server import run_agent_server

    run_agent_server(build(AgentServeOptions, given))


if __name__ == "__main__":  # pragma: no cover
    app()
