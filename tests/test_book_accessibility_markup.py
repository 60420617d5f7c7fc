"""book/accessibility.py: the markup fixes axe-core asks for, on the theme's and docutils' HTML."""
from book import accessibility

SIDEBAR = ('<li class="toctree-l1 has-children"><a class="reference internal" href="../docs/index.html">'
           'For instructors</a><details><summary><span class="toctree-toggle" role="presentation">'
           '<i class="fa-solid fa-chevron-down"></i></span></summary><ul></ul></details></li>')


def test_a_summary_with_only_the_chevron_gets_the_entrys_name():
    out = accessibility.label_summaries(SIDEBAR)
    assert '<summary aria-label="Show or hide the pages of For instructors">' in out


def test_a_summary_with_text_is_left_alone():
    html = '<li><details><summary><p class="caption">Part</p></summary></details></li>'
    assert "aria-label" not in accessibility.label_summaries(html)


def test_bibliography_entries_become_list_items():
    body = '<div role="list" class="citation-list">\n<div class="citation" id="id4" role="doc-biblioentry">'
    assert accessibility.BIBLIOENTRY.sub(r'\1 role="listitem"', body).endswith(
        '<div class="citation" id="id4" role="listitem">')
