"""Nothing outside accrot.position decides what a scheme is by its family's name: the study, the diagnostics,
resuming and the run ask the parts' declared facts (``accrot.position.facts``). A grep over the source, as the
repository tests do, for comparisons and reads of the selectors (``rotation``, ``far_mass``, ``increments``,
``output_gate``, ``layer_pattern``) and of a part's ``kind``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELECTOR = r"(?:rotation|far_mass|increments|output_gate|layer_pattern)"
COMPARED = r"\s*(?:==|!=|\bin\b|\bnot\s+in\b)"
PATTERNS = (
    re.compile(rf"\b{SELECTOR}{COMPARED}"),  # cfg.rotation == "accum", rotation in (...)
    re.compile(rf"\[\s*[\"']{SELECTOR}[\"']\s*\]{COMPARED}"),  # scheme["rotation"] != "none"
    re.compile(rf"\.get\(\s*[\"']{SELECTOR}[\"'][^)]*\){COMPARED}"),  # scheme.get("increments") == "softplus"
    re.compile(rf"getattr\([^)]*[\"']{SELECTOR}[\"'][^)]*\){COMPARED}"),  # getattr(cfg, "increments", None) == ...
    re.compile(rf"\.kind{COMPARED}\s*\(?\s*[\"']"),  # scheme.rotation.kind == "so2"
)
SCANNED = ("accrot/study", "accrot/diagnostics", "accrot/bench", "accrot/resume.py", "accrot/run", "callbacks")
# files other changes own, which still name families; each to be scanned once it reads the facts too
# path -> why it may test a family name
EXCLUDED: dict[str, str] = {"accrot/bench/storage.py": "its kind is a storage server's (proxy or database), no scheme's"}


def family_tests(root: Path = ROOT) -> list[str]:
    """``path:line: text`` of every line under :data:`SCANNED` (less :data:`EXCLUDED`) that tests a family name."""
    found = []
    for entry in SCANNED:
        base = root / entry
        for path in sorted([base] if base.is_file() else base.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in EXCLUDED:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if any(p.search(code) for p in PATTERNS):
                    found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_family_name_is_tested_outside_the_position_package():
    assert family_tests() == []


def test_the_grep_sees_every_form_of_a_family_test(tmp_path):
    """Known truth: each form the study and the diagnostics used to decide by family name is found; reading the
    facts and merely passing a selector on are not."""
    study = tmp_path / "accrot" / "study"
    study.mkdir(parents=True)
    bad = ['if cfg.rotation in ("accum", "path"):', 'return s["far_mass"] != "none"', 'if scheme_of(v)["rotation"] == "accum":',
           'if d.get("increments") in ("learned",):', 'getattr(scheme.cfg, "increments", None) == "random_position"',
           'so2 = scheme.rotation.kind == "so2"', 'return rotation in ROTATIONS and far == "none"']
    good = ['if facts(cfg).accumulates:', 'SchemeConfig(rotation="rope", far_mass="alibi")',
            '# a comment: rotation == "accum"', 'p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)',
            'title = scheme.get("rotation", "")', 'mass = stats["far_mass"]']
    (study / "bad.py").write_text("\n".join(bad) + "\n")
    (study / "good.py").write_text("\n".join(good) + "\n")
    assert [line.split(": ", 1)[1] for line in family_tests(tmp_path)] == bad
