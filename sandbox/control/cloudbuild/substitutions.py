"""Cloud Build substitutions: ``$PROJECT_ID``, ``${_MY_VAR}``, ``$$`` for a literal dollar.

Applied when the build is created, to step names, args, env, dir and entrypoint, ``options.env`` and
``images``. With the default ``MUST_MATCH`` option a template key nobody defines, or a user key no template
uses, refuses the build; ``ALLOW_LOOSE`` replaces unknown keys with nothing and ignores unused ones.
"""

from __future__ import annotations

import re

from google.cloud.devtools import cloudbuild_v1 as cb

USER_KEY = re.compile(r"^_[A-Z0-9_]+$")  # FACTS.md
# Only upper-case names are substitutions; "$home" or "${var}" in a shell line stay as written.
TEMPLATE = re.compile(r"\$(?:(\$)|\{([A-Z_][A-Z0-9_]*)\}|([A-Z_][A-Z0-9_]*))")
# Built-ins of a manual build; the repository ones are empty without a trigger.
# fmt: off
REPO_BUILTINS = (
    "REPO_NAME", "REPO_FULL_NAME", "BRANCH_NAME", "TAG_NAME", "REF_NAME", "REVISION_ID", "COMMIT_SHA", "SHORT_SHA",
    "TRIGGER_NAME", "TRIGGER_BUILD_CONFIG_PATH",
)
# fmt: on


class SubstitutionError(ValueError):
    """The build is refused with INVALID_ARGUMENT and this message."""


def apply_substitutions(build: cb.Build, builtins: dict[str, str]) -> None:
    """Substitute in place; raises SubstitutionError as Cloud Build refuses the build."""
    loose = build.options.substitution_option == cb.BuildOptions.SubstitutionOption.ALLOW_LOOSE
    user = dict(build.substitutions)
    for key in user:
        if not USER_KEY.match(key):
            raise SubstitutionError(
                f"invalid value for 'build.substitutions': substitution key \"{key}\" does not respect format "
                '"^_[A-Z0-9_]+$" and is not an overridable built-in substitution'
            )
    values = {**dict.fromkeys(REPO_BUILTINS, ""), **builtins}
    used: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        if match[1]:
            return "$"
        key = match[2] or match[3]
        if key in user:
            used.add(key)
            return user[key]
        if key in values:
            return values[key]
        if loose:
            return ""
        if key.startswith("_"):
            raise SubstitutionError(f'key in the template "{key}" is not matched in the substitution data')
        raise SubstitutionError(f'key in the template "{key}" is not a valid built-in substitution')

    def sub(text: str) -> str:
        return TEMPLATE.sub(replace, text)

    for step in build.steps:
        step.name = sub(step.name)
        step.args = [sub(a) for a in step.args]
        step.env = [sub(e) for e in step.env]
        step.dir_ = sub(step.dir_)
        step.entrypoint = sub(step.entrypoint)
    build.options.env = [sub(e) for e in build.options.env]
    build.images = [sub(i) for i in build.images]
    unused = sorted(set(user) - used)
    if unused and not loose:
        raise SubstitutionError(f'key "{unused[0]}" in the substitution data is not matched in the template')
