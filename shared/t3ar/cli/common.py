"""Shared CLI plumbing: error mapping, JSON or human output, progress bars, option types, the options of the
commands that talk to a service over HTTP."""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from pydantic import BaseModel
from tqdm import tqdm

from t3ar.acceptance import RULES
from t3ar.errors import T3arError

if TYPE_CHECKING:  # the HTTP commands import this module and must not pull in torch
    from t3ar.method.adapt import StepStats

F = TypeVar("F", bound=Callable[..., Any])


#: the API's hints of what to do next (its routes), as the CLI says them (its commands)
_CLI_HINTS = [(re.compile(r"; list jobs with GET /jobs\b"), "; list them with `t3ar jobs list`"),
              (re.compile(r"; (upload one with POST /models or )?list them with GET /models\b"),
               "; upload one with `t3ar models upload` or list them with `t3ar models list`"),
              (re.compile(r"; list them with GET /keys\b"), "; list them with `t3ar keys list`"),
              (re.compile(r": POST /jobs/\{id\}/readapt to run it again"), ": run it again with `t3ar jobs readapt`")]
_ROUTE = re.compile(r"^(GET|POST|PUT|DELETE|PATCH) /\S*: ")  # the client's "GET /jobs/x: " before the message


def cli_words(message: str) -> str:
    """An API error's message with its route hints (``GET /jobs``) said as the commands that do the same (and
    then without the route it called)."""
    said = message
    for pattern, words in _CLI_HINTS:
        said = pattern.sub(words, said)
    return _ROUTE.sub("", said) if said != message else message


def _click_errors(func: F, *, invalid_options: bool) -> F:
    """Domain errors -> a one-line ``Error: ...`` and exit code 1 (no traceback; an API's route hints said as
    commands: :func:`cli_words`); with ``invalid_options`` ValueErrors too (pydantic validation errors of configs
    are ValueErrors)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except T3arError as exc:
            raise click.ClickException(cli_words(str(exc))) from exc
        except ValueError as exc:
            if not invalid_options:
                raise
            raise click.ClickException(f"invalid option: {exc}") from exc

    return wrapper  # type: ignore[return-value]


def domain_errors(func: F) -> F:
    """Turn domain errors into a one-line ``Error: ...`` and exit code 1 (no traceback)."""
    return _click_errors(func, invalid_options=True)


def emit(payload: dict[str, Any], as_json: bool, human: Callable[[dict[str, Any]], str]) -> None:
    """Print the result: JSON on stdout with ``--json``, else the human summary."""
    if as_json:
        click.echo(json.dumps(payload, indent=2, default=str))
    else:
        click.echo(human(payload))


class StepBar:
    """A tqdm bar fed by ``on_step`` callbacks (quiet with --json so stdout stays machine-readable)."""

    def __init__(self, desc: str, enabled: bool = True) -> None:
        self.desc = desc
        self.enabled = enabled
        self.bar: tqdm[Any] | None = None

    def __call__(self, s: StepStats) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            # redraw at most every 10 s when stderr is a log file rather than a terminal
            interval = 0.1 if sys.stderr.isatty() else 10.0
            self.bar = tqdm(total=s.total_steps, desc=self.desc, file=sys.stderr, leave=False,
                            mininterval=interval, maxinterval=max(10.0, interval))
        self.bar.update(1)
        self.bar.set_postfix(epoch=s.epoch, loss=f"{s.loss:.3f}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")(func)


class MethodChoice(click.Choice[str]):
    """``--method``: the names of the method registry (:mod:`t3ar.method.registry`), read when the option is
    used, so that a method registered after the CLI was built is a choice too."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from t3ar.method import registry

        return registry.names()

    @choices.setter
    def choices(self, value: object) -> None:  # click's __init__ sets it; the registry is the one source
        pass


def device_option(func: F) -> F:
    return click.option("--device", default="auto", show_default=True,
                        help="auto (CUDA when present), cpu, cuda or cuda:N.")(func)


def holdout_options(*, scored: str, method: str, no_gain: str, rule_default: str | None,
                    rule_help: str) -> Callable[[F], F]:
    """The acceptance options of a run, local (``t3ar adapt``) or a job (``t3ar submit``): ``--holdout``,
    ``--candidates``, ``--require-gain``, ``--winner-rule``. The help says where they differ: what is done with the
    holdout (``scored``), the run's own method among the default candidates (``method``), what happens when no
    candidate beats the base model (``no_gain``), the rule's default and its help."""
    options = (
        click.option("--holdout", type=click.Path(exists=True, path_type=Path), default=None,
                     help="An acceptance holdout: labelled images of the target (class folders, a CSV of path,label, "
                          f"or an archive), never trained on{scored}"),
        click.option("--candidates", default="", help="With --holdout: methods to score, comma-separated [default: "
                                                      f"source, bn-adapt and {method}]."),
        click.option("--require-gain", is_flag=True, help=f"With --holdout: {no_gain} when no candidate beats the "
                                                          "base model."),
        click.option("--winner-rule", type=click.Choice(RULES), default=rule_default,
                     show_default=rule_default is not None, help=f"With --holdout: {rule_help}"),
    )

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def echo_result(as_json: bool, data: Any, text: str) -> None:
    """``data`` (JSON values, models of the API's answers among them) as JSON (sorted keys) with ``--json``, else
    ``text``."""
    click.echo(json.dumps(_plain(data), indent=2, sort_keys=True) if as_json else text)


def _plain(data: Any) -> Any:
    """``data`` with every pydantic model as its JSON dump: the fields the answer held (a model read from an
    answer dumps what the API sent)."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json", exclude_unset=True)
    if isinstance(data, list | tuple):
        return [_plain(v) for v in data]
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    return data


def service_options(what: str, url_env: str, default_url: str, token_env: Sequence[str]) -> Callable[[F], F]:
    """``--json``, ``--token`` (from the first of ``token_env`` that is set), ``--url`` of the service ``what``
    (env ``url_env``), and T3arError -> ClickException (exit 1 with the message, no traceback)."""
    envs = list(token_env)

    def deco(fn: F) -> F:
        command = click.option("--url", envvar=url_env, default=default_url, show_default=True,
                               help=f"{what} base URL (env {url_env}).")(_click_errors(fn, invalid_options=False))
        command = click.option("--token", envvar=envs, default=None,
                               help=f"Bearer token (env {' or '.join(envs)}).")(command)
        return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(command)

    return deco


def pct(x: object) -> str:
    """A fraction as a percentage with one decimal; ``-`` for None (not measured)."""
    return "-" if x is None else f"{100 * float(x):.1f}%"  # type: ignore[arg-type]

