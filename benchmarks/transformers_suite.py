"""transformers' own ``test_training_gradient_checkpointing*`` tests, plain and under ``pytest --recheck``.

For each architecture, runs ``pytest -k test_training_gradient_checkpointing`` on its
``tests/models/<arch>/test_modeling_<arch>.py`` twice, as written and with ``--recheck
--recheck-report``, and prints, per architecture, both outcomes, the checkpoint calls recheck
verified out of those it saw, its findings (kind and region) and its notes.  A finding on these
tests is a claim about transformers' code that has to be read against the model's source: the
tests pass as written, so every finding is either a real hazard the test does not look for or a
false finding of recheck's; a note that a forward could not be recorded is a checkpoint call left
unverified.

``--tests`` is a transformers tests tree: the sdist's ``tests/`` (``test_modeling_common.py`` holds
the tests) plus the per-model test files, which the sdist does not ship (the repository does).
``--python`` is an interpreter with transformers and recheck installed; put another recheck
checkout first with ``--recheck-src`` (its root, on ``PYTHONPATH``) to compare two versions.

    python benchmarks/transformers_suite.py --tests /path/to/tests --python /path/to/venv/bin/python \
        [--archs llama,bert,...] [--timeout 900] [--recheck-src DIR] [--recheck-option=--recheck-early-stop=off]
        [--no-plain] [--json out.json]

``--trainer`` instead runs a ``transformers.Trainer`` fine-tuning of tiny models built from configs
(a Llama causal LM, a BERT sequence classifier; dropout on, non-reentrant checkpointing, CPU)
for ``--steps`` optimizer steps, without the callback and with ``RecheckCallback`` watching the
first 2 steps and every step, in interleaved rounds, and prints each callback's report and the
wall time of ``trainer.train()`` against the run without it (best of the rounds).  Run it with
the interpreter that has transformers.

    python benchmarks/transformers_suite.py --trainer [--steps 20] [--rounds 3]

Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ARCHS = "llama,mistral,gemma,gemma2,qwen2,phi3,gpt_neox,gpt2,opt,mixtral,qwen2_moe,qwen3_moe,olmoe,bert,roberta,t5,bart,vit"
SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped|subtests passed|subtests failed)\b")


def run(python: str, tests: Path, arch: str, timeout: int, recheck: Path | None, env: dict, options: list[str]) -> dict:
    """One pytest run of an architecture's training tests: outcome counts, seconds, the report."""
    target = tests / "models" / arch / f"test_modeling_{arch}.py"
    command = [python, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore",
               str(target), "-k", "test_training_gradient_checkpointing"]
    if recheck is not None:
        command += ["--recheck", f"--recheck-report={recheck}", *options]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=tests.parent, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"outcome": f"timed out after {timeout} s", "seconds": timeout}
    seconds = time.perf_counter() - start
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-200:]
    counts = {kind: int(n) for n, kind in SUMMARY.findall(last)}
    outcome = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or last
    result: dict = {"outcome": outcome, "exit": done.returncode, "seconds": round(seconds, 1)}
    if recheck is not None and recheck.exists():
        tests_ = json.loads(recheck.read_text())["tests"]
        stats = Counter()
        for test in tests_:
            stats.update(test.get("stats", {}))
        result["invocations"] = stats["invocations"]
        result["verified"] = stats["verified"]
        result["findings"] = [f"{f.get('kind')}: {f.get('region')}: {f.get('message')}"
                              for test in tests_ for f in test.get("findings", [])]
        result["notes"] = sorted(Counter(re.sub(r"call \d+", "call N", n) for test in tests_
                                         for n in test.get("notes", [])).items())
    return result


def trainer(kind: str, steps: int, watched: int | None) -> tuple[float, object, float]:
    """Seconds of ``trainer.train()`` for ``steps`` optimizer steps of a tiny model, the
    callback's report (``watched`` steps watched; none: no callback) and the training loss."""
    import logging

    import torch
    import transformers

    from recheck.integrations.hf_trainer import RecheckCallback

    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.1)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.BertConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                         num_attention_heads=4, num_labels=3)
        model = transformers.BertForSequenceClassification(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (steps * 4, 32), generator=generator)
    labels = ids if kind == "llama" else torch.randint(0, 3, (steps * 4,), generator=generator)
    data = [{"input_ids": i, "labels": label} for i, label in zip(ids, labels)]
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=steps, per_device_train_batch_size=2, gradient_accumulation_steps=2,
            learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0)
        callback = RecheckCallback(steps=watched) if watched else None
        run = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback] if callback else [])
        logging.getLogger("transformers.trainer.recheck").setLevel(logging.ERROR)
        start = time.perf_counter()
        loss = run.train().training_loss
        seconds = time.perf_counter() - start
    return seconds, callback.report if callback else None, loss


def trainer_table(steps: int, rounds: int) -> None:
    import torch

    torch.set_num_threads(1)
    for kind in ("llama", "bert"):
        times: dict[str, list[float]] = {}
        reports, losses = {}, {}
        for _ in range(rounds):
            for label, watched in (("plain", None), ("2 watched", 2), (f"{steps} watched", steps)):
                seconds, report, losses[label] = trainer(kind, steps, watched)
                times.setdefault(label, []).append(seconds)
                reports[label] = report
        base = min(times["plain"])
        for label, spread in times.items():
            line = f"{kind:6} {label:11} best {min(spread):6.2f} s ({min(spread) / base:.2f}x), runs " + \
                ", ".join(f"{t:.2f}" for t in spread) + f"; loss {losses[label]:.6f}"
            report = reports[label]
            if report is not None:
                stats = report.stats
                line += (f"; {stats['verified']} of {stats['invocations']} calls verified, "
                         f"{len(report.findings)} finding(s), {len(report.notes)} note(s)")
            print(line, flush=True)
            if report is not None and (report.findings or report.notes):
                print("    " + str(report).replace("\n", "\n    "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=Path, help="a transformers tests tree (see above)")
    parser.add_argument("--trainer", action="store_true", help="time a Trainer run with and without the callback")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of a Trainer run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the Trainer runs")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--archs", default=ARCHS)
    parser.add_argument("--timeout", type=int, default=900, help="seconds for one pytest run")
    parser.add_argument("--recheck-src", type=Path, help="a recheck checkout to import instead of the installed one")
    parser.add_argument("--recheck-option", action="append", default=[],
                        help="another option for the --recheck run (repeat it), e.g. --recheck-early-stop=off")
    parser.add_argument("--plain", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the tests without --recheck")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    if args.trainer:
        trainer_table(args.steps, args.rounds)
        return 0
    if args.tests is None:
        parser.error("--tests is required (or --trainer)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.recheck_src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.recheck_src), env.get("PYTHONPATH")]))
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for arch in args.archs.split(","):
            row = rows[arch] = {}
            if args.plain:
                row["plain"] = run(args.python, args.tests.resolve(), arch, args.timeout, None, env, [])
            row["recheck"] = run(args.python, args.tests.resolve(), arch, args.timeout,
                                 Path(scratch) / f"{arch}.json", env, args.recheck_option)
            plain, watched = row.get("plain"), row["recheck"]
            print(f"{arch:10} " + (f"plain: {plain['outcome']} ({plain['seconds']} s) | " if plain else "") + "--recheck: "
                  f"{watched['outcome']} ({watched['seconds']} s), {watched.get('verified', '-')} of "
                  f"{watched.get('invocations', '-')} calls verified, {len(watched.get('findings', []))} finding(s), "
                  f"{sum(n for _, n in watched.get('notes', []))} note(s)", flush=True)
            for finding in watched.get("findings", []):
                print(f"    finding: {finding[:300]}")
            for note, count in watched.get("notes", []):
                print(f"    note x{count}: {note[:300]}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
