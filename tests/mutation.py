"""`make mutation` helpers, run inside the scratch copy (MUTATION_DIR): a seeded stratified sample of
server/'s mutants, and the score of a run with its confidence interval.

    python -m tests.mutation sample --size 450 --seed 22 [GLOB...] > sample.txt
    mutmut run $(cat sample.txt)
    python -m tests.mutation score sample.txt [--survivors]

`sample` generates the mutants (mutmut's own first phase: `mutmut run` finds them made and only runs
them), lists every mutant name of every mutated file (the `mutants/**/*.py.meta` files), keeps those
matching the GLOBs (mutmut's name globs, e.g. 'server.service*'; none = all) and draws `--size` of them
at random, stratified by file with proportional allocation: each file gets its share of the sample,
size x (its mutants / all mutants), rounded by largest remainder, and its mutants are drawn with
random.Random(f"{seed}:{file}"). The same tree, size and seed give the same names, and a file whose
mutants and share are unchanged gets the same ones after the rest changed. `--size 0` lists them all.

`score` reads the results mutmut stored (exit codes in the same .meta files) for the names given and
prints killed / tried per file and in total, with the stratified estimate of the whole population's
score and its 95% confidence interval (normal approximation with the finite-population correction).
A timeout counts as killed (the tests noticed: the mutant hung a server); "no tests" counts as tried
and not killed.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import math
import os
import random
import sys
from pathlib import Path

MUTANTS = Path("mutants")
KILLED = {1, 3}  # mutmut: the tests failed (3: pytest's internal error while collecting them)
TIMEOUT = {36, -24, 24, 152, 255, -9}  # CPU or wall time limit, SIGKILL after it
SURVIVED = 0
NO_TESTS = {5, 33}


def generate() -> None:
    """mutmut's mutant generation (the first phase of `mutmut run`), stdout kept clean."""
    from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants, setup_source_paths
    from mutmut.mutation.trampoline import set_mutant_under_test

    set_mutant_under_test("mutant_generation")
    MUTANTS.mkdir(exist_ok=True)
    stdout = os.dup(1)
    os.dup2(2, 1)  # mutmut prints every file it mutates
    try:
        copy_src_dir()
        copy_also_copy_files()
        setup_source_paths()
        create_mutants(os.cpu_count() or 2)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)


def exit_codes() -> dict[str, dict[str, int | None]]:
    """{source file: {mutant name: exit code or None (not run)}} of every mutated file."""
    out = {}
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if codes:
            out[str(meta.relative_to(MUTANTS))[: -len(".meta")]] = codes
    return out


def allocate(sizes: dict[str, int], total: int) -> dict[str, int]:
    """Proportional allocation of `total` over strata of `sizes`, by largest remainder."""
    population = sum(sizes.values())
    exact = {k: total * n / population for k, n in sizes.items()}
    counts = {k: math.floor(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: (counts[k] - exact[k], k))[: total - sum(counts.values())]:
        counts[k] += 1
    return counts


def draw(by_file: dict[str, list[str]], size: int, seed: int) -> list[str]:
    if size <= 0 or size >= sum(map(len, by_file.values())):
        return sorted(n for names in by_file.values() for n in names)
    counts = allocate({f: len(names) for f, names in by_file.items()}, size)
    picked = []
    for f in sorted(by_file):  # each file its own generator: a file's draw depends on it alone
        picked += random.Random(f"{seed}:{f}").sample(sorted(by_file[f]), counts[f])
    return sorted(picked)


def sample(args: argparse.Namespace) -> None:
    generate()
    by_file = {
        f: [n for n in codes if not args.globs or any(fnmatch.fnmatch(n, g) for g in args.globs)]
        for f, codes in exit_codes().items()
    }
    by_file = {f: names for f, names in by_file.items() if names}
    if not by_file:
        sys.exit(f"no mutant matches {' '.join(args.globs)}")
    names = draw(by_file, args.size, args.seed)
    population = sum(map(len, by_file.values()))
    print(f"sample: {len(names)} of {population} mutants, seed {args.seed}", file=sys.stderr)
    print("\n".join(names))


def kind(code: int | None) -> str:
    if code is None:
        return "not run"
    if code in KILLED:
        return "killed"
    if code in TIMEOUT:
        return "timeout"
    if code == SURVIVED:
        return "survived"
    if code in NO_TESTS:
        return "no tests"
    return f"other({code})"


def score(args: argparse.Namespace) -> None:
    codes = exit_codes()
    population = {f: len(c) for f, c in codes.items()}
    file_of = {n: f for f, c in codes.items() for n in c}
    names = Path(args.names).read_text().split() if args.names else sorted(file_of)
    per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    left = []
    for name in names:
        k = kind(codes[file_of[name]][name])
        per_file[file_of[name]][k] += 1
        if k not in ("killed", "timeout", "not run"):
            left.append((k, name))
    total: collections.Counter = collections.Counter()
    estimate = variance = 0.0
    all_mutants = sum(population[f] for f in per_file)
    print(f"{'file':36s} {'killed':>7s} {'tried':>6s} {'score':>7s}  outcomes")
    for f in sorted(per_file):
        c = per_file[f]
        tried = sum(v for k, v in c.items() if k != "not run")
        killed = c["killed"] + c["timeout"]
        total.update(c)
        if tried:
            p, w = killed / tried, population[f] / all_mutants
            estimate += w * p
            fpc = 1 - tried / population[f]
            variance += w * w * p * (1 - p) / max(tried - 1, 1) * fpc
        shown = f"{100 * killed / tried:6.1f}%" if tried else "      -"
        print(f"{f:36s} {killed:7d} {tried:6d} {shown}  {dict(c)}")
    tried = sum(v for k, v in total.items() if k != "not run")
    killed = total["killed"] + total["timeout"]
    print(f"{'total':36s} {killed:7d} {tried:6d} {100 * killed / max(tried, 1):6.1f}%  {dict(total)}")
    half = 1.96 * math.sqrt(variance)
    print(
        f"stratified estimate over the {all_mutants} mutants of these files: {100 * estimate:.1f}% "
        f"(95% CI {100 * (estimate - half):.1f}-{100 * (estimate + half):.1f}%)"
    )
    if args.survivors:
        for k, name in left:
            print(f"{k}: {name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="generate the mutants and print a seeded stratified sample of names")
    s.add_argument("--size", type=int, default=0, help="mutants to draw (0 = all)")
    s.add_argument("--seed", type=int, default=22)
    s.add_argument("globs", nargs="*", help="mutant name globs to draw from (default: all)")
    s.set_defaults(run=sample)
    r = sub.add_parser("score", help="killed / tried of a run, per file, with a 95%% confidence interval")
    r.add_argument("names", nargs="?", help="file of mutant names (default: every mutant)")
    r.add_argument("--survivors", action="store_true", help="list the mutants not killed")
    r.set_defaults(run=score)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
