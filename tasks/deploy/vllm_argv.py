"""The `vllm serve` flags as vLLM's parser reads them: one spelling per flag, the user's extra_args merged in.

vLLM's parser (argparse) keeps the last of a repeated flag without a word. Rendering a flag and appending the
user's own would run the user's value while every check that reads the first saw the rendered one. So a flag the
user gives in ``vllm.extra_args`` replaces the rendered flag at its place, each flag appears once, and the checks
read the merged argv (``flag_value``): the value that runs.
"""

from __future__ import annotations

from collections.abc import Collection

# vLLM's short spellings (vllm/engine/arg_utils.py add_cli_args: "--quantization", "-q"; "-tp", "-pp", "-dp").
SHORT_FLAGS = {
    "-q": "--quantization",
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
}


def parser_spelling(arg: str) -> str:
    """The flag as vLLM's FlexibleArgumentParser reads it (vllm/utils/argparse_utils.py parse_args): underscores
    become dashes in a long flag's name up to the first '.', and -q/-tp/-pp/-dp are short for long flags."""
    flag = arg.split("=", 1)[0]
    if flag in SHORT_FLAGS:
        return SHORT_FLAGS[flag]
    if flag.startswith("--"):
        name, dot, rest = flag[2:].partition(".")
        return "--" + name.replace("_", "-") + dot + rest
    return flag


def is_flag(item: str) -> bool:
    """A flag, not a value: starts with '-' and is not a negative number."""
    return item.startswith("-") and not item.lstrip("-").replace(".", "", 1).isdigit()


def canonical_flag(arg: str, known: Collection[str]) -> str:
    """The flag ``arg`` sets, named as in ``known`` when it is one of them in any spelling argparse accepts: the
    parser's spelling, the ``--no-`` of a boolean (BooleanOptionalAction), or an unambiguous prefix of a long flag
    (allow_abbrev; an ambiguous one vLLM refuses anyway). Otherwise its parser spelling."""
    flag = parser_spelling(arg)
    if flag in known:
        return flag
    if flag.startswith("--no-") and "--" + flag[5:] in known:
        return "--" + flag[5:]
    if flag.startswith("--") and len(flag) > 4:
        prefixed = [name for name in known if name.startswith(flag)]
        if len(prefixed) == 1:
            return prefixed[0]
    return flag


def flag_groups(argv: list[str]) -> list[list[str]]:
    """The argv cut at each flag: a flag with the values after it (``--f v``, ``--f=v``, a bare boolean). Items
    before the first flag (a positional) form a group of their own."""
    groups: list[list[str]] = []
    for item in argv:
        if is_flag(item) or not groups:
            groups.append([item])
        else:
            groups[-1].append(item)
    return groups


def _rendered_name(group: list[str]) -> str:
    """A rendered flag's name, the ``--no-`` of a boolean dropped so the user's other spelling meets it."""
    flag = parser_spelling(group[0])
    return "--" + flag[5:] if flag.startswith("--no-") else flag


def merge_flags(rendered: list[str], extra: list[str]) -> list[str]:
    """The rendered flags with the user's ``extra`` merged in: a user's flag (``--f v``, ``--f=v`` or a boolean, in
    any spelling) replaces the rendered one at its place; the user's other items follow in their order."""
    rendered_groups = flag_groups(rendered)
    names = [_rendered_name(group) for group in rendered_groups]
    replacing: dict[str, list[list[str]]] = {}
    tail: list[str] = []
    for group in flag_groups(extra):
        name = canonical_flag(group[0], names) if is_flag(group[0]) else None
        if name in names:
            # Every occurrence the user wrote goes to the place, so a repeat stays visible to the checks.
            replacing.setdefault(name, []).append(group)
        else:
            tail += group
    merged: list[str] = []
    for name, group in zip(names, rendered_groups, strict=True):
        if name not in replacing:
            merged += group
        elif replacing[name]:
            merged += [item for users in replacing[name] for item in users]
            replacing[name] = []  # placed: a second rendered spelling of the same flag goes
    return merged + tail


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value vLLM reads for ``flag`` (a long flag, in the parser's spelling) from ``argv``: the last occurrence
    in any spelling, ``--f=v`` or ``--f v``; None when it is absent or has no value."""
    value = None
    for group in flag_groups(argv):
        if not is_flag(group[0]) or canonical_flag(group[0], (flag,)) != flag:
            continue
        value = _value_of(group)
    return value


def _value_of(group: list[str]) -> str | None:
    """A flag group's value: after the '=' of ``--f=v``, else the item after the flag, else None (a boolean)."""
    _, equals, after = group[0].partition("=")
    if equals:
        return after
    return group[1] if len(group) > 1 else None
