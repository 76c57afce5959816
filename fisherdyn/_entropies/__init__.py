"""The entropy families: the abstract bases, one module per family, and the registry.

Every module of this folder is imported here, so that a family's own file is all it takes:
its class registers itself when it is defined (`AbstractEntropy.__init_subclass__`, by its
`parse_names`) and is exported from here and from `fisherdyn` by its class name.
"""

import pkgutil as _pkgutil
from importlib import import_module as _import_module

from ._base import (
    AbstractComponentLaw as AbstractComponentLaw,
    AbstractEntropy as AbstractEntropy,
    AbstractSeparableEntropy as AbstractSeparableEntropy,
    AbstractTsallisShapedEntropy as AbstractTsallisShapedEntropy,
    ComponentLawSwitch as ComponentLawSwitch,
)

# The library's families by name, for type checkers and in the order the command line and the
# operator table show them; a family this list does not name comes after them.
from ._shannon import Shannon as Shannon
from ._tsallis import Tsallis as Tsallis
from ._renyi import Renyi as Renyi
from ._sharma_mittal import SharmaMittal as SharmaMittal
from ._kaniadakis import Kaniadakis as Kaniadakis
from ._burg import Burg as Burg
from ._abe import Abe as Abe
from ._parse import (
    default_entropies as default_entropies,
    entropy_label as entropy_label,
    families as families,
    parse_entropy as parse_entropy,
)

for _module in _pkgutil.iter_modules(__path__):
    _import_module(f"{__name__}.{_module.name}")
globals().update({_family.__name__: _family for _family in families()})
