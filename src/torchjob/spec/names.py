"""Name and reference formats Kubernetes and container runtimes accept."""

from __future__ import annotations

import re

DNS1123_LABEL_MAX = 63
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Compiled (and cached by re) on first use: a plain job needs neither of these three.
_DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# The Docker distribution reference grammar: [registry[:port]/]path[:tag][@digest].
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    r"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?)/)?"
    rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # a tag is ASCII (Python's \w is not)
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)


def is_dns1123_label(value: str) -> bool:
    return len(value) <= DNS1123_LABEL_MAX and bool(_DNS1123_LABEL.fullmatch(value))


def is_dns1035_label(value: str) -> bool:
    return len(value) <= DNS1123_LABEL_MAX and bool(re.fullmatch(_DNS1035_LABEL, value))


def is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(_DNS1123_SUBDOMAIN.fullmatch(value))


def is_label_value(value: str) -> bool:
    """A Kubernetes label value: empty, or up to 63 of ``[-A-Za-z0-9_.]`` starting and ending alphanumeric."""
    return value == "" or (len(value) <= DNS1123_LABEL_MAX and bool(re.fullmatch(_LABEL_NAME, value)))


def is_qualified_name(value: str) -> bool:
    """A label or annotation key: an optional DNS subdomain prefix and ``/``, then a label-like name."""
    prefix, slash, name = value.rpartition("/")
    if slash and not is_dns1123_subdomain(prefix):
        return False
    return 0 < len(name) <= DNS1123_LABEL_MAX and bool(re.fullmatch(_LABEL_NAME, name))


def is_env_name(value: str) -> bool:
    return bool(re.fullmatch(_ENV_NAME, value))


def is_image_reference(value: str) -> bool:
    return len(value) <= 4096 and bool(_IMAGE.fullmatch(value))


def label_problem(value: str) -> str:
    """Why ``value`` is not a DNS-1123 label, for an error message."""
    if len(value) > DNS1123_LABEL_MAX:
        return f"{value!r} is {len(value)} characters; at most {DNS1123_LABEL_MAX} are allowed"
    return (
        f"{value!r} is not a DNS-1123 label: use lower-case letters, digits and '-', "
        "starting and ending with a letter or digit"
    )


def image_problem(value: str) -> str:
    """Why ``value`` is not an image reference, for an error message."""
    bad = sorted({c for c in value if not (c.isascii() and (c.isalnum() or c in "._-/:@[]"))})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        return f"{value!r} is not a valid image reference: it contains {shown}; expected 'registry/name:tag'"
    repository = value.split("@")[0].rsplit("/", 1)[-1].split(":")[0]
    if repository != repository.lower():
        return f"{value!r} is not a valid image reference: repository names are lower-case"
    return f"{value!r} is not a valid image reference; expected 'registry/name:tag'"
