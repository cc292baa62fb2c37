"""Sphinx configuration: the docs site (MyST Markdown pages; the CLI reference from the click
definitions, the worker API from docstrings). Built by .ci/run with warnings as errors:
    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

from elasticrun import __version__

project = "elasticrun"
author = "The elasticrun authors"
copyright = "2026, The elasticrun authors"
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "sphinxcontrib.mermaid",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links to headings, checked at build
myst_fence_as_directive = ["mermaid"]  # ```mermaid blocks are pictures

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "furo"
html_title = f"elasticrun {release}"
html_static_path: list[str] = []


def setup(app):  # type: ignore[no-untyped-def]
    from sphinx.transforms import SphinxTransform

    class OneLabelForTheCommand(SphinxTransform):
        """Both of the command's forms are `elasticrun`: sphinx-click labels each section by
        the program's name, so the torchrun form's page drops that label (the page's own
        title is its target)."""

        default_priority = 200

        def apply(self) -> None:
            if self.env.docname == "reference/cli-torchrun":
                for name in [n for n in self.document.nameids if n.startswith("elasticrun")]:
                    del self.document.nameids[name]
                    self.document.nametypes.pop(name, None)

    app.add_transform(OneLabelForTheCommand)
