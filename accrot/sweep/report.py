"""Tables and figures from extrapolation results (one run, several runs side by side, or an Optuna study:
``accrot report --study NAME``), and the metric names (``nll@16x``) sweeps and pruning share."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from accrot.display import plain_help
from accrot.io import atomic_savefig, atomic_write_text, pyplot
from accrot.metrics import mean_std, metric_key, parse_metric, pm
from accrot.options import option, parse, read_dir, text, write_dir
from accrot.run.rundir import holding
from accrot.sweep.storage import STORAGE


# ---------------------------------------------------------------------------------------------------
# study reports: `accrot report --study NAME`
# ---------------------------------------------------------------------------------------------------
def _fmt_params(params: Mapping) -> str:
    out = []
    for k, v in params.items():
        out.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return ", ".join(out) or "(base config)"


def _multipliers(metrics: Mapping[str, float]) -> list[float]:
    return sorted({parse_metric(k)[1] for k in metrics if k.startswith("nll@")})


def study_trials(storage, names: Sequence[str]) -> list[dict]:
    """One flat row per trial of every named study (all states): what the CSV holds."""
    import optuna

    rows = []
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        attrs = study.user_attrs.get("accrot", {})
        objectives = attrs.get("objectives") or [f"value{i}" for i in range(len(study.directions))]
        for t in study.get_trials(deepcopy=False):
            row = {
                "study": name, "variant": attrs.get("variant") or t.user_attrs.get("variant", ""),
                "number": t.number, "state": t.state.name, "seed": t.user_attrs.get("seed"),
                "config": t.user_attrs.get("config"), "retry_of": t.user_attrs.get("retry_of"),
                "duration_s": round(t.duration.total_seconds(), 3) if t.duration else None,
            }
            for obj, value in zip(objectives, t.values or [None] * len(objectives)):
                row[f"objective:{obj}"] = value
            row.update({f"param:{k}": v for k, v in t.params.items()})
            row.update(t.user_attrs.get("metrics") or {})
            row["run_dir"] = t.user_attrs.get("run_dir", "")
            row["fail_reason"] = t.user_attrs.get("fail_reason", "")
            row["_params"] = dict(t.params)
            row["_objectives"] = objectives
            row["_directions"] = [d.name.lower() for d in study.directions]
            rows.append(row)
    return rows


def _best_configs(rows: Sequence[dict]) -> dict[str, dict]:
    """Per variant, the configuration (a sampled point, over its seeds) with the best mean first objective."""
    by_variant: dict[str, dict[tuple, list[dict]]] = {}
    for r in rows:
        if r["state"] != "COMPLETE":
            continue
        cfg = (r["study"], r["config"] if r["config"] is not None else r["number"])
        by_variant.setdefault(r["variant"] or r["study"], {}).setdefault(cfg, []).append(r)
    out = {}
    for variant, configs in by_variant.items():
        obj = rows[0]["_objectives"][0]
        sign = -1.0 if rows[0]["_directions"][0] == "maximize" else 1.0
        key = f"objective:{obj}"
        best_cfg = min(configs.values(), key=lambda rs: sign * mean_std([r[key] for r in rs])[0])
        best_trial = min((r for rs in configs.values() for r in rs), key=lambda r: sign * r[key])
        out[variant] = {"config": best_cfg, "best_trial": best_trial, "n_configs": len(configs),
                        "n_trials": sum(len(rs) for rs in configs.values())}
    return out


def plot_study_nll(best: Mapping[str, dict], path: str | Path, title: str = "") -> Path:
    """NLL vs evaluation length (multiple of the training length), per variant: mean ± std over seeds."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, b in best.items():
        rs = b["config"]
        mults = _multipliers(rs[0])
        stats = [mean_std([r[metric_key("nll", m)] for r in rs if metric_key("nll", m) in r]) for m in mults]
        ax.errorbar(mults, [s[0] for s in stats], yerr=[s[1] or 0.0 for s in stats], marker="o", capsize=3,
                    label=f"{variant} (#{rs[0]['config']}, {len(rs)} seed{'s' if len(rs) > 1 else ''})")
    ax.set_xscale("log", base=2)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.grid(True, alpha=0.3)
    ax.set_xlabel("evaluation length / training length")
    ax.set_ylabel("mean NLL (nats/token)")
    ax.set_title(title or "best configuration per variant (mean ± std over seeds)")
    ax.legend(fontsize=8)
    atomic_savefig(fig, path)
    plt.close(fig)
    return Path(path)


def plot_importance(study, path: str | Path, title: str = "") -> Path | None:
    """Parameter importance (optuna.importance, first objective); None with fewer than 2 completed trials
    or when no parameter varies."""
    import warnings

    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    varying = {k for t in done for k in t.params if len({json.dumps(u.params.get(k)) for u in done}) > 1}
    if len(done) < 2 or not varying:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importances = optuna.importance.get_param_importances(study, target=lambda t: t.values[0])
    if not importances:
        return None
    plt = pyplot()
    names = list(importances)[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5))
    ax.barh(names, [importances[n] for n in names])
    ax.set_xlabel("importance (share of the first objective's variation)")
    ax.set_title(title or f"parameter importance: {study.study_name}")
    atomic_savefig(fig, path)
    plt.close(fig)
    return Path(path)


def _csv_text(rows: Sequence[dict]) -> str:
    import csv
    import io

    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if not k.startswith("_") and k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    return buf.getvalue()


def _best_table(best: Mapping[str, dict], objectives: Sequence[str]) -> list[str]:
    """Per variant: the best configuration's NLL at each length, mean ± std over its seeds, and its params."""
    lines: list[str] = []
    mults = sorted({m for b in best.values() for r in b["config"] for m in _multipliers(r)})
    header = ["variant", "trials", "best trial", "config", "seeds", *(f"NLL {m:g}×" for m in mults), "params"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for variant, b in sorted(best.items()):
        rs, bt = b["config"], b["best_trial"]
        obj = f"objective:{objectives[0]}"
        cells = [variant, str(b["n_trials"]), f"#{bt['number']} {bt[obj]:.4f}", f"#{rs[0]['config']}", str(len(rs)),
                 *(pm([r[metric_key('nll', m)] for r in rs if metric_key("nll", m) in r]) for m in mults),
                 _fmt_params(rs[0]["_params"]).replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    if not best:
        lines.append("| (no completed trials) |" + " |" * (len(header) - 1))
    return lines


def _pareto(storage, names: Sequence[str], objectives: Sequence[str]) -> list[str]:
    import optuna

    lines = ["", "## Pareto front", ""]
    for name in names:
        s = optuna.load_study(study_name=name, storage=storage)
        for t in sorted(s.best_trials, key=lambda t: t.values[0]):
            vals = ", ".join(f"{o}={v:.4f}" for o, v in zip(objectives, t.values))
            lines.append(f"- {name} #{t.number}: {vals} — {_fmt_params(t.params)}")
    return lines


def study_report(study: str, storage_url: str | None = None, root: str | Path = "runs/sweeps",
                 out: str | Path | None = None) -> dict[str, Path]:
    """Write ``report.md`` (per variant: the best configuration's NLL at each length, mean ± std over
    seeds, with its params), ``nll_vs_length.png``, ``importance*.png`` and ``trials.csv`` (every trial)
    into ``out`` (default ``results/<study>/``). ``study`` is a spec's name: its variants' studies
    (``<study>/<variant>``) are included."""
    import optuna

    from accrot.errors import UsageError
    from accrot.sweep.storage import StorageRef, open_storage, redact

    ref = StorageRef.parse(storage_url, study, root)
    storage = open_storage(ref)
    names = [n for n in optuna.get_all_study_names(storage) if n == study or n.startswith(study + "/")]
    if not names:
        there = ", ".join(sorted({n.split("/")[0] for n in optuna.get_all_study_names(storage)})) or "none"
        raise UsageError(f"no study {study!r} in storage {redact(ref.url)!r}; studies there: {there}")
    rows = study_trials(storage, names)
    if not rows:  # a report of nothing would read "Objectives: ." and an empty table
        raise UsageError(f"study {study!r} in storage {redact(ref.url)!r} has no trials yet; run its workers first "
                         f"(accrot sweep SPEC --worker --storage URL), then accrot report")
    out = Path(out) if out else Path("results") / study
    with holding(out, "--out", "the report's folder"):
        return _write(out, rows, study, ref, names, storage)


def _write(out: Path, rows: list[dict], study: str, ref, names: list[str], storage) -> dict[str, Path]:
    """The report's files in ``out`` (held by the caller)."""
    import optuna

    from accrot.sweep.storage import redact

    written = {"csv": out / "trials.csv", "markdown": out / "report.md"}
    atomic_write_text(written["csv"], _csv_text(rows))
    best = _best_configs(rows)
    objectives = rows[0]["_objectives"] if rows else []
    directions = rows[0]["_directions"] if rows else []
    lines = [f"# Study `{study}`", "",
             f"Storage `{redact(ref.url)}`; {len(names)} stud{'y' if len(names) == 1 else 'ies'}, {len(rows)} trials: "
             + ", ".join(f"{sum(r['state'] == s for r in rows)} {s.lower()}"
                         for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")) + ".",
             "", f"Objectives: {', '.join(f'{o} ({d})' for o, d in zip(objectives, directions))}. Per variant, the "
             "configuration with the best mean first objective over its seeds; NLL columns are mean ± std over "
             "those seeds (nats/token).", ""]
    lines += _best_table(best, objectives)
    if len(objectives) > 1:
        lines += _pareto(storage, names, objectives)
    if best:
        written["nll_png"] = plot_study_nll(best, out / "nll_vs_length.png", title=f"{study}: NLL vs length")
        lines += ["", "![NLL vs length](nll_vs_length.png)"]
    for name in names:
        suffix = "" if name == study else "-" + name[len(study) + 1:]
        png = plot_importance(optuna.load_study(study_name=name, storage=storage), out / f"importance{suffix}.png")
        if png is not None:
            written[f"importance{suffix}"] = png
            lines += ["", f"![parameter importance {name}]({png.name})"]
    failed = [r for r in rows if r["state"] == "FAIL"]
    if failed:
        lines += ["", "## Failed trials", ""]
        lines += [f"- {r['study']} #{r['number']}: {r['fail_reason'] or 'no reason recorded (heartbeat stale?)'}"
                  for r in failed]
    lines += ["", "All trials: [trials.csv](trials.csv)", ""]
    atomic_write_text(written["markdown"], "\n".join(lines))
    return written


def main(argv: list[str]) -> int:
    """``accrot report --study NAME [--storage URL]``: tables, figures and a CSV of a finished study."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="accrot report", exit_on_error=False, description=plain_help(main.__doc__))
    option(parser, "--study", kind=text("a study name"), type=str, required=True, help="the spec's name (its variants are included)")
    option(parser, "--storage", kind=STORAGE, type=str | None, default=None,
                        help="the sweep's storage URL (default: <root>/<study>/study.db)")
    option(parser, "--root", kind=read_dir("the sweeps' run root"), type=str, default="runs/sweeps", help="the sweeps' run root")
    option(parser, "--out", kind=write_dir("an output folder"), type=str | None, default=None, help="output folder (default: results/<study>)")
    args = parse(parser, argv)
    written = study_report(args.study, args.storage, args.root, args.out)
    print(Path(written["markdown"]).read_text())
    for path in written.values():
        print(path)
    return 0
