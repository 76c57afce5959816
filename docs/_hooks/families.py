"""Griffe extension: each entropy family in `fisherdyn/_entropies/` is documented as
`fisherdyn.<Name>`, the name the package exports it by at run time (from the registry), so
that a family's entry on its docs page needs no import of it in `fisherdyn/__init__.py`."""

from __future__ import annotations

import griffe


class FamilyExports(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.name != "fisherdyn":
            return
        for module in pkg["_entropies"].modules.values():
            for cls in module.classes.values():
                # a family registers itself by declaring its parse names
                if "parse_names" in cls.members and cls.name not in pkg.members:
                    pkg.set_member(cls.name, griffe.Alias(cls.name, cls, parent=pkg))
