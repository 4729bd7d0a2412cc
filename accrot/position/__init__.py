"""Position schemes: ``SchemeConfig`` + ``build``. One file per family; importing the package
registers every family."""

from accrot.errors import ConfigError

# each module registers its family
from accrot.position import accum, alibi, forget, gate, nope, path, rope, ssmax  # noqa: F401
from accrot.position.config import SchemeConfig
from accrot.position.declared import SchemeFacts, facts, ignored
from accrot.position.scheme import FAR_MASS, INCREMENTS, OUTPUT_GATES, ROTATIONS, PositionScheme, build

__all__ = ["ConfigError", "SchemeConfig", "SchemeFacts", "PositionScheme", "build", "facts", "ignored", "ROTATIONS", "FAR_MASS",
           "OUTPUT_GATES", "INCREMENTS"]
