"""A family of variants: the one shape of every pluggable config section (algorithm, correction, task, retriever).

    ALGORITHMS = Family(PolicyLossConfig, tag="type", section="learner.algorithm", noun="algorithm")
    ALGORITHMS.register(PPOConfig)                      # one line per member, in the family's settings module
    algorithm: ALGORITHMS.choice = Field(default_factory=GRPOConfig)     # the config field
    cfg.learner.algorithm.build(correction)             # the member makes its implementation
    cfg.learner.algorithm.needs_critic                  # and owns the facts everyone else reads

A member is a pydantic model, a subclass of the family's base, with a `Literal` tag field whose default is its name,
its own knobs, the facts other parts read (class attributes: a critic, a group baseline, a local index) and a
`build(...)` that makes its implementation: the class its `implementation` names by import path (algorithms, tasks),
or code in the member's own module that imports its heavy libraries inside (retrievers). Either way the settings
load without torch or faiss, and the implementation may import its settings without a circle.
`members` keeps them in registration order (the first is the default). The family is open: a member defined outside
the package (a test's, a user's) registers the same way, and a config is checked against the members registered
when it is loaded. An unknown name, or a knob of another member, fails naming what is known.

The config layer (`config/unions.py`) reads a family through its base's `union_tag` and `union_members()`, which
`Family` sets on the base, so the loader, the strict checks and the configuration reference walk every member.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, BeforeValidator, SerializeAsAny

B = TypeVar("B", bound=BaseModel)


class Family(Generic[B]):
    """The registered members of one variant family, chosen by the tag field `tag` of the section `section`."""

    def __init__(self, base: type[B], *, tag: str, section: str, noun: str) -> None:
        self.base, self.tag, self.section, self.noun = base, tag, section, noun
        # tag -> member, in registration order (the first is the default)
        self.members: dict[str, type[B]] = {}
        # read by the config layer: the base stands for the union of its registered members
        base.union_tag = tag  # type: ignore[attr-defined]
        base.union_members = classmethod(lambda cls: list(self.members.values()))  # type: ignore[attr-defined]

    def tag_of(self, member: type[B]) -> str:
        """The name of a member: the default of its tag field."""
        field = member.model_fields.get(self.tag)
        default = None if field is None else field.default
        if not isinstance(default, str):
            raise TypeError(
                f"{member.__name__}.{self.tag} needs its name as default: `{self.tag}: Literal['x'] = 'x'`"
            )
        return default

    def register(self, member: type[B]) -> type[B]:
        """Add `member` (idempotent for the same class); TypeError for a name already taken or a non-member."""
        if not (isinstance(member, type) and issubclass(member, self.base)):
            raise TypeError(f"a {self.noun} member is a {self.base.__name__} subclass, not {member!r}")
        name = self.tag_of(member)
        taken = self.members.get(name)
        if taken is not None and taken is not member:
            raise TypeError(f"{self.noun} {self.tag} {name!r} is already {taken.__name__}'s")
        self.members[name] = member
        return member

    def known(self) -> str:
        return ", ".join(self.members)

    def default(self) -> B:
        """The first registered member with its defaults."""
        return next(iter(self.members.values()))()

    def member(self, name: Any) -> type[B]:
        """The member called `name`; ValueError naming the known ones."""
        found = self.members.get(name) if isinstance(name, str) else None
        if found is None:
            raise ValueError(f"unknown {self.section}.{self.tag} {name!r}; known {self.tag}s: {self.known()}")
        return found

    def choose(self, value: Any) -> B:
        """The member `value` names: a name, a mapping with the tag (absent: the default member), or settings
        already made. ValueError naming the known members, or the members that have a knob the chosen one has not."""
        if isinstance(value, self.base):
            if self.members.get(getattr(value, self.tag)) is not type(value):
                raise ValueError(
                    f"{type(value).__name__} is not a registered {self.noun}; known {self.tag}s: {self.known()}"
                )
            return value
        if isinstance(value, str):
            value = {self.tag: value}
        if not isinstance(value, dict):
            raise ValueError(
                f"{self.section} must be a {self.tag} name or a mapping with a {self.tag!r}, got "
                f"{type(value).__name__}"
            )
        name = value.get(self.tag, next(iter(self.members)))
        member = self.member(name)
        for key in value:
            if key not in member.model_fields:
                owners = [other for other, m in self.members.items() if key in m.model_fields]
                if owners:
                    raise ValueError(
                        f"{self.section}.{key} is a setting of {', '.join(owners)}, not of {name!r} (its settings: "
                        f"{', '.join(member.model_fields)})"
                    )
        return member.model_validate(value)

    @property
    def choice(self) -> Any:
        """The type of the config field: any registered member, picked by the tag, dumped with all of its fields."""
        return Annotated[SerializeAsAny[self.base], BeforeValidator(self.choose)]
