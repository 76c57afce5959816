from ._base import (
    AbstractComponentLaw as AbstractComponentLaw,
    AbstractEntropy as AbstractEntropy,
    AbstractSeparableEntropy as AbstractSeparableEntropy,
    AbstractTsallisShapedEntropy as AbstractTsallisShapedEntropy,
    ComponentLawSwitch as ComponentLawSwitch,
)
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
