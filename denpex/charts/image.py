"""A rendered chart, and how it is inlined into markdown (Prefect's UI shows data-URI PNGs)."""

from __future__ import annotations

import base64

from pydantic import BaseModel, ConfigDict

from denpex.markdown_text import inline

__all__ = ["Chart", "png_data_uri", "png_markdown"]


class Chart(BaseModel):
    """One rendered picture: a name fit for an artifact key and the PNG bytes."""

    model_config = ConfigDict(frozen=True)

    name: str
    title: str
    png: bytes


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...``: renders in Prefect's UI, in artifacts and beside a form."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def png_markdown(png: bytes, alt: str) -> str:
    """A markdown image of ``png`` inlined as a data URI."""
    return f"![{inline(alt, limit=200)}]({png_data_uri(png)})"
