"""Sphinx extension: serve the "Open in Colab" badge from the book and check where it points.

Chapters show the usual badge, ``[![Open In Colab](<COLAB_BADGE>)](<colab link>)``, so that
it works on GitHub and in Colab. In the book that remote image would need the network, so
it is swapped for the copy at ``colab_badge_local`` (relative to the book's folder).
On a notebook page the badge must open that very notebook: a link that differs from the
launch button's URL is a warning (an error under ``-W``).

Pages of the book itself can write the badge of any chapter with the ``colab`` role,
``{colab}`notebooks/01_linear_attention```, whose link is built from ``_config.yml``.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxRole

COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
logger = logging.getLogger(__name__)


def expected_colab_url(config, docname: str) -> str | None:
    """The Colab URL of ``docname``'s notebook, built like sphinx-book-theme's launch button."""
    opts = config.html_theme_options or {}
    colab = opts.get("launch_buttons", {}).get("colab_url", "").strip("/")
    repo_url = opts.get("repository_url", "").strip("/")
    if not colab or not repo_url:
        return None
    org, repo = repo_url.rsplit("/", 2)[-2:]
    branch = opts.get("repository_branch", "") or "main"
    prefix = opts.get("path_to_docs", "").strip("/")
    path = f"{prefix}/{docname}.ipynb" if prefix else f"{docname}.ipynb"
    return f"{colab}/github/{org}/{repo}/blob/{branch}/{path}"


class LocalColabBadge(SphinxTransform):
    """Point every Colab badge image at the local copy; check badge links on notebook pages."""

    default_priority = 400

    def apply(self, **kwargs) -> None:
        docname = self.env.docname
        on_notebook = str(self.env.doc2path(docname)).endswith(".ipynb")
        expected = expected_colab_url(self.config, docname) if on_notebook else None
        for image in list(self.document.findall(nodes.image)):
            if image.get("uri") != COLAB_BADGE:
                continue
            image["uri"] = _local_uri(self.config)
            link = image.parent if isinstance(image.parent, nodes.reference) else None
            target = link.get("refuri") if link is not None else None
            if expected and target != expected:
                logger.warning(
                    "Colab badge links to %r; this notebook's Colab URL is %r",
                    target, expected, location=image, type="colab_badge", subtype="link",
                )


def _local_uri(config) -> str:
    """The badge's path relative to the book's folder, in Sphinx's "/" (source root) form."""
    return "/" + config.colab_badge_local.lstrip("/")


class ColabRole(SphinxRole):
    """``{colab}`docname``` → the badge, linked to the chapter's notebook on Colab."""

    def run(self):
        docname = self.text.strip()
        url = expected_colab_url(self.config, docname)
        if url is None or docname not in self.env.found_docs:
            msg = self.inliner.reporter.error(
                f"colab role: {docname!r} is not a page of the book, or no Colab URL is configured",
                line=self.lineno)
            return [self.inliner.problematic(self.rawtext, self.rawtext, msg)], [msg]
        image = nodes.image(uri=_local_uri(self.config), alt="Open in Colab")
        return [nodes.reference("", "", image, refuri=url, internal=False)], []


def setup(app: Sphinx) -> dict:
    app.add_config_value("colab_badge_local", "figures/colab-badge.svg", "env", [str])
    app.add_transform(LocalColabBadge)
    app.add_role("colab", ColabRole())
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
