"""Position schemes: ``SchemeConfig`` + ``build`` (DESIGN §2). One file per family; importing the package
registers every built family."""

from accrot.position import nope  # noqa: F401  (registers "none")
from accrot.position.config import ConfigError, SchemeConfig
from accrot.position.scheme import FAR_MASS, ROTATIONS, PositionScheme, build

for _optional in ("rope", "accum", "path", "alibi", "forget"):
    try:  # families land one file at a time; a missing file simply leaves its value "not built yet"
        __import__(f"accrot.position.{_optional}")
    except ModuleNotFoundError as err:  # pragma: no cover - only while a family is absent
        if err.name != f"accrot.position.{_optional}":
            raise

__all__ = ["ConfigError", "SchemeConfig", "PositionScheme", "build", "ROTATIONS", "FAR_MASS"]
