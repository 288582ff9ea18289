"""Readers for the deployment files and the commands they must share with the README and Makefile.

No Docker engine runs where the tests run, so the Dockerfile and compose.yaml are read as text:
`dockerfile_stages` splits a Dockerfile into stages of (INSTRUCTION, arguments); `make_recipes`
expands a Makefile's simple variables and returns each target's prerequisites and recipe;
`entry_mismatches` compares the three files' install and entry commands and names each difference.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    global_args: dict[str, str | None]
    stages: list[Stage]

    @property
    def runtime(self) -> Stage:
        return self.stages[-1]

    def args(self) -> set[str]:
        """Every build argument declared anywhere (global or in a stage)."""
        names = set(self.global_args)
        for stage in self.stages:
            names |= {arg.split("=", 1)[0] for arg in stage.all("ARG")}
        return names


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) in order; comments dropped, backslash continuations joined."""
    instructions, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    if pending:
        raise ValueError("the Dockerfile ends inside a continued instruction")
    return instructions


def parse_dockerfile(text: str) -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for keyword, args in dockerfile_instructions(text):
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if keyword != "ARG":
                raise ValueError(f"{keyword} before the first FROM")
            arg_name, _, default = args.partition("=")
            global_args[arg_name] = default or None
        else:
            stages[-1].instructions.append((keyword, args))
    return Dockerfile(global_args, stages)


def exec_form(args: str) -> list[str]:
    """The argument list of an exec-form CMD / ENTRYPOINT / HEALTHCHECK CMD (JSON array)."""
    value = json.loads(args)
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ValueError(f"not an exec-form command: {args}")
    return value


def healthcheck_command(args: str) -> list[str]:
    """HEALTHCHECK [--options] CMD [...] -> the command's argument list."""
    head, sep, command = args.partition("CMD ")
    if not sep:
        raise ValueError(f"HEALTHCHECK without CMD: {args}")
    return exec_form(command.strip())


def env_pairs(args: str) -> dict[str, str]:
    """ENV k=v [k=v ...] (the form this project uses)."""
    return dict(word.split("=", 1) for word in shlex.split(args))


# ---------------------------------------------------------------------------------------- Makefile

VARIABLE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(\?=|:=|=)\s*(.*)$")
REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, variables: dict[str, str]) -> str:
    for _ in range(10):
        expanded = REFERENCE.sub(lambda m: variables.get(m.group(1), m.group(0)), text)
        if expanded == text:
            return expanded
        text = expanded
    raise ValueError(f"variables do not settle: {text}")


def make_recipes(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """{target: (prerequisites, recipe lines)} with simple `$(VAR)` references expanded."""
    variables: dict[str, str] = {}
    rules: dict[str, tuple[list[str], list[str]]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("\t"):
            if current is not None:
                current.append(line.strip())
            continue
        stripped = line.split("#", 1)[0].rstrip()
        if not stripped:
            continue
        match = VARIABLE.match(stripped)
        if match:
            variables[match.group(1)] = match.group(3).strip()
            current = None
            continue
        target, sep, prereqs = stripped.partition(":")
        if sep and not target.startswith("."):
            current = []
            rules[expand(target.strip(), variables)] = (prereqs.split(), current)
        else:
            current = None
    return {
        target: ([expand(p, variables) for p in prereqs], [expand(r, variables) for r in recipe])
        for target, (prereqs, recipe) in rules.items()
    }


def make_assignments(run: str) -> list[str]:
    """Names of the variables a RUN line assigns on a `make` command line (`make env EXTRAS=x`)."""
    names = []
    for command in re.split(r"&&|;", run):
        words = shlex.split(command)
        if words and words[0] == "make":
            names += [word.split("=", 1)[0] for word in words[1:] if VARIABLE.match(word.replace("=", " = ", 1))]
    return names


# ------------------------------------------------------------------------------------ comparisons

README_RUN = re.compile(r"^\s*make run\s+#\s*=\s*(.+?)\s*$", re.MULTILINE)


def entry_mismatches(dockerfile: str, makefile: str, readme: str) -> list[str]:
    """What differs between the image's install / entry commands and the README's and Makefile's.

    - the builder installs by running `make env` (the Makefile target that `make run` and
      `make test` depend on), and installs nothing with pip on its own; a variable it passes
      (`make env EXTRAS=...`) is one a Makefile recipe reads;
    - the image's CMD is the Makefile's `run` recipe, with relative paths taken from WORKDIR;
    - the README's `make run  # = ...` line names that same command.
    """
    problems: list[str] = []
    image = parse_dockerfile(dockerfile)
    rules = make_recipes(makefile)
    runs = [args for stage in image.stages for args in stage.all("RUN")]
    if not any(re.search(r"(^|&&|;)\s*make\s+(\S+\s+)*env(\s|$)", run) for run in runs):
        problems.append("the Dockerfile does not run `make env`")
    if any("pip install" in run or "pip3 install" in run for run in runs):
        problems.append("the Dockerfile runs pip install itself: a second recipe beside `make env`")
    recipe_lines = [line for line in makefile.splitlines() if line.startswith("\t")]
    for run in runs:
        for variable in make_assignments(run):
            if not any(f"$({variable})" in line for line in recipe_lines):
                problems.append(f"the Dockerfile passes {variable}= to make, which no Makefile recipe reads")
    if "env" not in rules:
        problems.append("the Makefile has no `env` target")
    elif not any("pip install" in line for prereq in rules["env"][0] for line in rules.get(prereq, ([], []))[1]):
        problems.append("the Makefile's `env` target does not install with pip")
    if "run" not in rules or len(rules["run"][1]) != 1:
        problems.append("the Makefile's `run` target is not one command")
        return problems
    make_run = shlex.split(rules["run"][1][0])
    if "env" in rules and not set(rules["run"][0]) & {"env", *rules["env"][0]}:
        problems.append("`make run` does not depend on what `make env` builds")
    workdir = PurePosixPath(image.runtime.last("WORKDIR") or "/")
    expected = [str(workdir / make_run[0]) if "/" in make_run[0] else make_run[0], *make_run[1:]]
    cmd = image.runtime.last("CMD")
    if cmd is None or exec_form(cmd) != expected:
        problems.append(f"the image's CMD {cmd} is not `make run` ({' '.join(expected)}, from WORKDIR {workdir})")
    match = README_RUN.search(readme)
    if match is None:
        problems.append("the README has no `make run  # = <command>` line")
    elif shlex.split(match.group(1)) != make_run:
        problems.append(f"the README says `make run` = {match.group(1)!r}, the Makefile runs {' '.join(make_run)!r}")
    return problems
