"""``accrot sample --ckpt RUN --prompt TEXT``: a trained model's continuation of a prompt, decoded from its cache
(one token at O(context × D) per head), printed as text by its run's tokenizer. Every option and the checkpoint are
checked before any computing: a bad one is one line naming it."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from jsonargparse import ArgumentParser
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from accrot.errors import EXIT_INTERRUPTED, BadInput, UsageError, one_line
from accrot.options import FREE_TEXT, conflicts, count, no_effect_unless, number, option, parse, read_file
from accrot.run.args import DEVICE, READ_CKPT, check_device
from accrot.run.checkpoints import load_data_module, open_checkpoint

HELP = ("Continue a prompt with a checkpoint of an accrot run (a .ckpt file or its run directory), decoding from the "
        "cache: greedy at --temperature 0, else sampled (optionally from the --top_k likeliest tokens), reproducible "
        "by --seed. The prompt is encoded and the continuation decoded by the run's own tokenizer (bytes: invalid "
        "UTF-8 is shown as U+FFFD); the prompt and its continuation are printed.")


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="accrot sample", exit_on_error=False, description=HELP)
    option(parser, "--ckpt", kind=READ_CKPT, type=str, required=True, help="a checkpoint (.ckpt) of an accrot run, or its run "
                        "directory")
    option(parser, "--prompt", kind=FREE_TEXT, type=str | None, default=None, help="the text to continue")
    option(parser, "--prompt_file", kind=read_file("a UTF-8 text file"), type=str | None, default=None, help="a UTF-8 file holding the prompt instead")
    option(parser, "--max_new_tokens", kind=count(1), type=int, default=200, help="tokens to generate (at least 1)")
    option(parser, "--temperature", kind=number(0, low_open=False, what="0: greedy"), type=float, default=1.0, help="0: greedy; otherwise the softmax temperature")
    option(parser, "--top_k", kind=count(1), type=int | None, default=None, help="sample from the k likeliest tokens only")
    option(parser, "--seed", kind=count(0, 2**63 - 1), type=int, default=0, help="the seed of the draws")
    option(parser, "--config", kind=read_file("a config.yaml"), type=str | None, default=None,
                        help="the run's config.yaml (default: RUN/config.yaml beside RUN/checkpoints/)")
    option(parser, "--device", kind=DEVICE, type=str, default="cpu", help="cpu, cuda, cuda:1, ... (one this machine has)")
    conflicts(parser, "--prompt", "--prompt_file", "each gives the whole prompt")
    for flag in ("--top_k", "--seed"):  # greedy decoding draws nothing
        no_effect_unless(parser, flag, lambda a: a.temperature > 0, "--temperature 0 decodes greedily, drawing nothing")
    args = parse(parser, argv)
    text = _prompt(args)
    device = check_device(args.device)
    _, lit, _, _, config = open_checkpoint(args.ckpt, args.config)
    tokenizer = load_data_module(config).tokenizer
    ids = _encode(tokenizer, text, lit.model.cfg.vocab_size)

    import torch

    from accrot.run.generate import generate

    model = lit.model.eval().to(device)
    generator = torch.Generator().manual_seed(args.seed)
    prompt = torch.tensor([ids], dtype=torch.long, device=device)  # [1, T]
    new: list[int] = []
    with _progress(args.max_new_tokens) as advance:
        try:
            generate(model, prompt, args.max_new_tokens, args.temperature, args.top_k, generator,
                     on_token=lambda token: (new.append(int(token[0])), advance()))
        except KeyboardInterrupt:  # Ctrl-C keeps what was generated: printed, then the shell's code for SIGINT
            sys.stdout.write(text + _decode(tokenizer, new) + "\n")
            print(f"accrot: interrupted after {len(new)} of {args.max_new_tokens} tokens (printed above)",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
    sys.stdout.write(text + _decode(tokenizer, new) + "\n")
    return 0


@contextlib.contextmanager
def _progress(total: int):
    """A progress bar of the tokens generated, on stderr when it is a terminal (nothing otherwise); yields the
    function that counts one token."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda: None
        return
    with Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("tokens", total=total)
        yield lambda: bar.advance(task)


def _prompt(args) -> str:
    """The prompt text of ``--prompt`` or ``--prompt_file`` (exactly one, not empty)."""
    if (args.prompt is None) == (args.prompt_file is None):
        raise UsageError("give the prompt by --prompt TEXT or by --prompt_file PATH (one of them)")
    if args.prompt_file is not None:
        path = Path(args.prompt_file)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"--prompt_file {str(path)!r} does not exist") from None
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"--prompt_file {str(path)!r} cannot be read as UTF-8 text ({one_line(str(err))[:120]})"
                             ) from None
        where = f"--prompt_file {str(path)!r}"
    else:
        text, where = args.prompt, "--prompt"
    if not text:
        raise UsageError(f"{where} is empty; give at least one token of prompt to continue")
    return text


def _encode(tokenizer, text: str, vocab_size: int) -> list[int]:
    """The prompt's token ids, or a one-line UsageError where the run's tokenizer or the model cannot take it."""
    try:
        ids = list(tokenizer.encode(text))
    except (BadInput, UnicodeError, ValueError) as err:
        raise UsageError(f"the prompt cannot be encoded by the run's tokenizer ({tokenizer.name}): "
                         f"{one_line(str(err))[:200]}") from None
    if not ids:
        raise UsageError(f"the prompt encodes to no token with the run's tokenizer ({tokenizer.name}); give text "
                         "it reads")
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise UsageError(f"the prompt holds token id {bad}, outside the model's vocabulary 0..{vocab_size - 1}")
    return ids


def _decode(tokenizer, ids: list[int]) -> str:
    """The continuation as text: the tokenizer's own decode (bytes replace invalid UTF-8)."""
    try:
        return tokenizer.decode(ids)
    except BadInput:  # an id the tokenizer has no text for (a model wider than its tokenizer)
        return "".join(tokenizer.decode([i]) if 0 <= i < tokenizer.vocab_size else "\ufffd" for i in ids)
