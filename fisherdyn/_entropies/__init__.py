from ._families import (
    AbstractEntropy as AbstractEntropy,
    AbstractSeparableEntropy as AbstractSeparableEntropy,
    AbstractTsallisShapedEntropy as AbstractTsallisShapedEntropy,
    Abe as Abe,
    Burg as Burg,
    Kaniadakis as Kaniadakis,
    Renyi as Renyi,
    Shannon as Shannon,
    SharmaMittal as SharmaMittal,
    Tsallis as Tsallis,
    _concrete as _concrete,
    parse_entropy as parse_entropy,
)
