"""``accrot eval --ckpt PATH``: a checkpoint evaluated at many lengths, on the fixed blocks of its run's data
(``extrapolation.json``, ``extrapolation.png`` and the table). Every option, the checkpoint, the device and the
output folder are checked before any computing: a bad one is one line naming the option."""

from __future__ import annotations

import json
from pathlib import Path

from jsonargparse import ArgumentParser
from rich.console import Console

from accrot.errors import UsageError
from accrot.evaluation import (
    SAME_TARGET_ANCHORS,
    SCHEMA,
    eval_sets,
    evaluate_lengths,
    evaluate_same_targets,
    nll_table,
    plot_curves,
    rise_table,
    same_target_budget,
)
from accrot.io import atomic_write_text
from accrot.options import (
    FLAG,
    POSITIVE,
    choice,
    conflicts,
    count,
    needs,
    numbers,
    option,
    parse,
    parse_numbers,
    read_file,
    write_dir,
)
from accrot.position.rope_scaling import SCALINGS, RopeScaling, apply_rope_scaling
from accrot.run.args import DEVICE, READ_CKPT, check_device
from accrot.run.checkpoints import (
    check_eval_config,
    load_data_module,
    open_checkpoint,
    output_folder,
    provenance,
)
from accrot.run.generate import exact_by_depth, generated_exact

HELP = ("Evaluate a checkpoint of an accrot run at many multiples of its training length, on the fixed evaluation "
        "blocks of its data: writes extrapolation.json and extrapolation.png into --out (default RUN/eval, or "
        "RUN/eval-KIND with --rope_scaling) and prints the NLL table. --ckpt takes a .ckpt file or a run directory "
        "(its checkpoints/last.ckpt); --config may point at other data of the same training length, never at "
        "another model.")


def build_parser() -> ArgumentParser:
    """``accrot eval``'s options, each declared of its kind (accrot.options), and how they interact."""
    parser = ArgumentParser(prog="accrot eval", exit_on_error=False, description=HELP)
    option(parser, "--ckpt", kind=READ_CKPT, type=str, required=True, help="a checkpoint (.ckpt) of an accrot run, or its run "
                        "directory")
    option(parser, "--config", kind=read_file("a config.yaml"), type=str | None, default=None,
                        help="the run's config.yaml (default: RUN/config.yaml beside RUN/checkpoints/)")
    option(parser, "--multipliers", kind=numbers(), type=str, nargs="+", default=["1", "2", "4", "8", "16", "32"],
                        help="evaluation lengths as multiples of the training length: 1 2 4 or '[1,2,4]'")
    option(parser, "--lengths", kind=numbers(what="lengths in tokens", whole=True), type=str, nargs="+", default=None,
                        help="explicit lengths in tokens instead: 128 512 or '[128,512]'")
    option(parser, "--budget_tokens", kind=count(1), type=int, default=32768, help="scored tokens per length")
    option(parser, "--max_batch_tokens", kind=count(1), type=int, default=16384, help="tokens per forward pass")
    option(parser, "--same_target_anchors", kind=count(0), type=int, default=SAME_TARGET_ANCHORS,
                        help="windows per length of the same-target rise on a corpus (0: none; at most the blocks' "
                        "own token budget)")
    option(parser, "--out", kind=write_dir("an output folder"), type=str | None, default=None, help="output folder (default: RUN/eval)")
    option(parser, "--device", kind=DEVICE, type=str, default="cpu", help="cpu, cuda, cuda:1, ... (one this machine has)")
    option(parser, "--rope_scaling", kind=choice(*SCALINGS), type=str | None, default=None,
                        help=f"an evaluation-time RoPE extension: {', '.join(SCALINGS)} (RoPE checkpoints only; "
                        "yarn is the field's code form, yarn-paper its paper's equation)")
    option(parser, "--rope_factor", kind=POSITIVE, type=float | None, default=None,
                        help="the extension's factor s (default: s = T / L at each evaluation length T)")
    option(parser, "--generate", kind=FLAG, type=bool, default=False,
                        help="retrieval tasks (passkey, multikey, ...): also generate each answer greedily from the "
                        "block before it and score it exactly, per length and depth, beside the teacher-forced "
                        "accuracy")
    conflicts(parser, "--multipliers", "--lengths", "--lengths replaces the multipliers")
    needs(parser, "--rope_factor", "--rope_scaling")
    return parser


def main(argv: list[str]) -> int:
    """``accrot eval --ckpt PATH``: evaluate a checkpoint at many lengths; writes JSON + PNG."""
    parser = build_parser()
    args = parse(parser, argv)
    multipliers = parse_numbers("--multipliers", args.multipliers)
    lengths = parse_numbers("--lengths", args.lengths) if args.lengths is not None else None
    device = check_device(args.device)
    ckpt, model, state, run_dir, config = open_checkpoint(args.ckpt, args.config)
    dm = load_data_module(config)
    if args.config:  # another config than the run's own: it may name other data, never another model
        check_eval_config(ckpt, state, Path(args.config), dm)
    train_length = int(dm.seq_len)
    lengths = [int(n) for n in lengths] if lengths else sorted({max(1, round(m * train_length)) for m in multipliers})
    if min(lengths) < 2:  # a 1-token block has no position to evaluate (the per-position buckets need two)
        flag = "--lengths" if args.lengths is not None else "--multipliers"
        raise UsageError(f"{flag} gives an evaluation length of {min(lengths)} token(s) at L = {train_length}; each "
                         "length needs at least 2 tokens")
    scaling = _scaling(args, train_length)
    sets = eval_sets(dm, lengths, args.budget_tokens)  # fails before any work
    check_generation(args.generate, dm, sets, scaling)
    apply_rope_scaling(model, scaling)
    folder = Path(args.out) if args.out else run_dir / ("eval" if scaling is None else f"eval-{scaling.kind}")
    with output_folder(folder) as out:
        model.eval().to(device)
        with Console(stderr=True).status("evaluating"):
            results = evaluate_lengths(model, sets.blocks, train_length, args.max_batch_tokens, device=device,
                                       masks=sets.masks, depths=sets.depths, targets=sets.targets)
            same = None  # on a corpus: every length scores the same targets too (answer tasks score answers)
            if args.same_target_anchors and sets.masks is None and hasattr(dm, "val_stream"):
                anchors = same_target_budget(args.same_target_anchors, lengths, args.budget_tokens)
                same = evaluate_same_targets(model, dm.val_stream, lengths, train_length, anchors=anchors,
                                             max_batch_tokens=args.max_batch_tokens, device=device)
        rows = [r.to_dict() for r in results]
        score_generated(args.generate, model.model, sets, rows, args.max_batch_tokens, device)
        doc = {"schema": SCHEMA, "train_length": train_length, "budget_tokens": args.budget_tokens,
               **provenance("eval", argv, ckpt), "scheme": model.hparams.get("scheme"), "data": dm.describe(),
               "final": {"step": state.get("global_step"), "lengths": rows,
                         **({"same_targets": same} if same is not None else {})}}
        if scaling is not None:
            doc["rope_scaling"] = scaling.record()
        label = model.scheme_config.label() if scaling is None else scaling.label()
        plot_curves({label: rows}, train_length, out / "extrapolation.png", title=str(ckpt))
        atomic_write_text(out / "extrapolation.json", json.dumps(doc, indent=1))
    Console().print(nll_table({label: rows}, train_length))
    if same is not None:
        Console().print(rise_table({label: same}, train_length))
    if sets.masks is not None:  # a synthetic task scores answers: their accuracy too
        Console().print(nll_table({label: rows}, train_length, title="answer accuracy per length", field_="accuracy"))
    if args.generate:
        Console().print(generation_table(label, rows, train_length))
    print(out / "extrapolation.json")
    return 0


def _scaling(args, train_length: int):
    """The requested RoPE extension, or None; a bad name or factor is a one-line error before any work."""
    if args.rope_scaling is None:
        return None
    return RopeScaling(args.rope_scaling, train_length, args.rope_factor)


def check_generation(generate: bool, dm, sets, scaling) -> None:
    """With ``generate`` (``--generate``): it needs a task whose one answer ends each block, read back as the model wrote it (passkey and the
    retrieval tasks), and no RoPE extension (cached decoding has none); a one-line UsageError otherwise."""
    if not generate:
        return
    if scaling is not None:
        raise UsageError("--generate decodes from the cache, which takes no RoPE extension; drop --rope_scaling")
    task = getattr(dm, "task", None)
    if sets.masks is None or sets.depths is None or getattr(task, "hidden_answer", None) is not None:
        name = getattr(task, "name", type(dm).__name__)
        raise UsageError(f"--generate scores a retrieval task's answer (passkey, multikey_needle, multivalue_needle, "
                         f"variable_tracking); this run's data is {name}")


def score_generated(generate: bool, model, sets, rows: list[dict], max_batch_tokens: int, device) -> None:
    """With ``generate``: each length's answers generated greedily and scored exactly, ``generated_exact`` (the share
    of blocks whose whole answer is right) and ``generated_by_depth`` added to its row."""
    if not generate:
        return
    with Console(stderr=True).status("generating the answers"):
        _score_generated(model, sets, rows, max_batch_tokens, device)


def _score_generated(model, sets, rows: list[dict], max_batch_tokens: int, device) -> None:
    for row in rows:
        ln = row["length"]
        exact = generated_exact(model, sets.blocks[ln], sets.masks[ln], sets.targets[ln], max_batch_tokens, device)
        row["generated_exact"], row["generated_by_depth"] = exact_by_depth(exact, sets.depths[ln])


def generation_table(label: str, rows: list[dict], train_length: int):
    """Per depth and length: the generated answers' exact accuracy beside the teacher-forced per-token accuracy."""
    from rich.table import Table

    table = Table(title=f"{label}: answers generated greedily, exact (teacher-forced per-token accuracy)")
    table.add_column("depth")
    for row in rows:
        table.add_column(f"{row['length'] / train_length:g}×", justify="right")
    depths = sorted({d for r in rows for d in r["generated_by_depth"] or {}}, key=float)  # a short set lacks some

    def cell(r: dict, depth: str) -> str:
        got = (r["generated_by_depth"] or {}).get(depth)
        return "-" if got is None else f"{got:.2f} ({(r['accuracy_by_depth'] or {}).get(depth, 0):.2f})"

    for depth in depths:
        table.add_row(depth, *(cell(r, depth) for r in rows))
    table.add_row("all", *(f"{r['generated_exact']:.2f} ({r['accuracy']:.2f})" for r in rows), style="bold")
    return table
