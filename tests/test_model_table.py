"""Every model type of transformers' image-text-to-text map is split exactly or refused with its reason,
and docs/models.md's table is the code's."""

import os
import sys

import pytest

from mpipe_hf.models import FAMILIES, get_family
from mpipe_hf.models.coverage import REFUSED, image_text_types, refusal

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, os.path.join(ROOT, "scripts", "report"))
import model_table  # noqa: E402

REFUSED_TYPES = sorted(t for t in image_text_types() if t not in FAMILIES)


def test_the_table_in_docs_is_the_codes(capsys):
    assert model_table.main(["--check"]) == 0, capsys.readouterr().err[-2000:]


def test_the_readme_counts_are_the_tables():
    """README's "N model types exact in CI, M more (timm towers) by a script" is docs/models.md's count line."""
    import re
    with open(os.path.join(ROOT, "docs", "models.md")) as f:
        ci, script = re.search(r"(\d+) exact \(CI\), (\d+) exact \(script\)", f.read()).groups()
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = " ".join(f.read().split())
    assert f"{ci} model types exact in CI, {script} more" in readme, (ci, script)


def test_every_mapped_type_has_a_row_and_a_status():
    rows = {t: status for t, _, status, _ in model_table.rows()}
    assert set(image_text_types()) <= set(rows)
    assert all(rows[t] == "refused" for t in REFUSED_TYPES)
    assert all(rows[t] != "refused" for t in image_text_types() if t in FAMILIES)


@pytest.mark.parametrize("model_type", REFUSED_TYPES)
def test_a_refused_type_is_refused_with_its_reason(model_type):
    reason = refusal(model_type)
    assert reason and len(reason) > 20
    with pytest.raises(ValueError, match=f"model_type '{model_type}' cannot be split: ") as err:
        get_family(model_type)
    assert reason in str(err.value)


def test_no_refusal_names_a_declared_type():
    """A declaration wins over a stale refusal: a type is one or the other."""
    assert not set(REFUSED) & set(FAMILIES), sorted(set(REFUSED) & set(FAMILIES))
