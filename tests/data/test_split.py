"""The hashed train/validation split shared by the stdlib corpus (files) and Hugging Face data (documents):
pinned values, so a change that reshuffles which items are validation fails here."""

from __future__ import annotations

import pytest

from accrot.errors import DataError
from data_modules.split import (
    DOCUMENT_SALT,
    FILE_SALT,
    check_both_splits,
    document_fraction,
    file_fraction,
    split_fraction,
)

# the values of the split as first released (files: accrot/file-split/v1, documents: accrot/document-split/v1)
FILES = {
    "os.py": 0.14575809846187107,
    "json/decoder.py": 0.14139968542786038,
    "mod03.py": 0.9681423209072328,
    "a\udcffb.py": 0.030733104511116945,  # a file name that is not UTF-8 (surrogate escape)
    "ü/ß.py": 0.9653633310219538,
}
DOCUMENTS = {0: 0.07809810307044583, 1: 0.28710703595203935, 7: 0.12027834730323818,
             1023: 0.8306485898588334, 10**6: 0.0797809509390002}


@pytest.mark.parametrize("relpath, fraction", FILES.items(), ids=list(range(len(FILES))))
def test_file_fraction_is_pinned(relpath, fraction):
    assert file_fraction(relpath) == fraction == split_fraction(FILE_SALT, relpath)


@pytest.mark.parametrize("index, fraction", DOCUMENTS.items())
def test_document_fraction_is_pinned(index, fraction):
    assert document_fraction(index) == fraction == split_fraction(DOCUMENT_SALT, str(index))


def test_salts_are_distinct():
    assert FILE_SALT == b"accrot/file-split/v1\0" and DOCUMENT_SALT == b"accrot/document-split/v1\0"
    assert split_fraction(FILE_SALT, "0") != split_fraction(DOCUMENT_SALT, "0") == document_fraction(0)


def test_check_both_splits_names_the_bound():
    check_both_splits([0.1, 0.9], 0.5, "files", "under 'x'")  # one each side: fine
    with pytest.raises(DataError) as err:
        check_both_splits([0.12345, 0.9], 0.1, "files", "under 'x'")
    assert str(err.value) == ("val_fraction=0.1 puts none of the 2 files under 'x' in the validation split; "
                              "use val_fraction >= 0.1235 or more files")
    with pytest.raises(DataError) as err:
        check_both_splits([0.1, 0.45678], 0.5, "documents", "of 'y'")
    assert str(err.value) == ("val_fraction=0.5 puts all 2 documents of 'y' in the validation split; "
                              "use val_fraction <= 0.4567 or more documents")
