"""Constrained numbers shared by the config sections (pydantic ``Annotated`` types)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
Prob = Annotated[float, Field(ge=0.0, lt=1.0)]
PosFloat = Annotated[float, Field(gt=0.0)]
NonNegFloat = Annotated[float, Field(ge=0.0)]
