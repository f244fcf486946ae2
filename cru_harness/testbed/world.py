"""A deterministic fictitious world in TOFU's exact schema, small enough for a tiny model to memorise.

TOFU (locuslab/TOFU) is 200 fictitious authors x 20 templated QA pairs plus utility sets (`real_authors`,
`world_facts`) whose knowledge a real model got from *pretraining*. A tiny model trained from scratch has no
pretraining, so here the utility sets are about general facts of the same fictitious world (its countries and
its classic authors) and they are part of every tiny model's training data (`World.utility_rows`). The
fine-tuned model and the retain-only oracle both learn them; only the forget authors differ.

`write_tofu_layout(world, out_dir)` writes the Hub's layout (`{config}.json` JSON-lines files plus
`idontknow.jsonl`), so TOFU's loader (`cru_harness.benchmarks.tofu.data.load_tofu(config, data_dir=out_dir)`) and the TOFU tasks read a
fictitious world exactly as they read the real benchmark.

Split conventions follow TOFU: the forget authors are the *last* authors of `full` (forget01 within forget05
within forget10), retainXX is the complement, holdoutXX are extra authors never put into `full`, and
`retain_perturbed` has as many rows as `forget10_perturbed`, taken from the first retain authors.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError

FORGET_PERCENTS = (1, 5, 10)

# ---------------------------------------------------------------------------------------------------------
# Vocabulary of the world. Invented place names so nothing collides with real-world knowledge.
# ---------------------------------------------------------------------------------------------------------
FIRST_NAMES = (
    "Aldric", "Bexley", "Corvina", "Daxon", "Elowen", "Fennick", "Galadra", "Halvard", "Isolde", "Jorvik",
    "Kestrel", "Lysandra", "Marek", "Nerissa", "Orrin", "Perrin", "Quillon", "Rosalind", "Sorrel", "Tamsin",
    "Ulric", "Vesper", "Wrenna", "Xander", "Yseult", "Zephyrine", "Brannoc", "Cressida", "Dorian", "Emberly",
    "Faelan", "Giselle", "Hollis", "Ingrid", "Jasper", "Katya", "Leopold", "Mirela", "Nikolai", "Odessa",
)
SURNAMES = (
    "Ashgrove", "Blackwood", "Caldera", "Dunmore", "Everhart", "Fairbourne", "Greythorn", "Hollowell",
    "Ironwood", "Juniper", "Kettleby", "Larkspur", "Merriweather", "Northcott", "Oakhaven", "Pembrook",
    "Quarrington", "Ravensworth", "Stormvale", "Thistlewood", "Underhill", "Valecrest", "Whitlock", "Yarrowby",
    "Zellwood", "Brightwater", "Coldbrook", "Dewhurst", "Elderfield", "Foxglove",
)
# country -> capital, two more cities, currency, language, river
COUNTRIES = (
    ("Veloria", "Marrowgate", ("Tessaly", "Brindle Cove"), "the velor crown", "Velorian", "the Amberflow"),
    ("Kestmark", "Holmvik", ("Sarnholt", "Ebbin Ford"), "the kest mark", "Kestish", "the Greywater"),
    ("Sundaria", "Solenne", ("Port Aurel", "Miradel"), "the sun dinar", "Sundari", "the Goldrun"),
    ("Orvania", "Castel Orv", ("Lindqvar", "Helmsreach"), "the orvan florin", "Orvanic", "the Silverthread"),
    ("Brevonia", "Brevik", ("Toller's Rest", "Ashcombe"), "the brevon shilling", "Brevonese", "the Duskwater"),
    ("Caldoria", "Caldera Bay", ("Vintmoor", "Rookhaven"), "the caldor peso", "Caldorian", "the Emberlee"),
    ("Lumeria", "Lumen City", ("Starhollow", "Pellwick"), "the lumen", "Lumeric", "the Glimmerrun"),
    ("Thessaly Reach", "Northgate", ("Frostmere", "Kellan's Point"), "the reach penny", "Reachic", "the Coldspring"),
)
GENRES = (
    "mystery novels", "science fiction", "historical fiction", "poetry", "fantasy", "romance novels",
    "horror stories", "travel writing", "biographies", "satire", "children's books", "crime thrillers",
)
JOBS = (
    "a baker", "a lighthouse keeper", "a cartographer", "a glassblower", "a veterinarian", "a carpenter",
    "an astronomer", "a tailor", "a fisherman", "a librarian", "a pharmacist", "a clockmaker", "a beekeeper",
    "a sailor", "a schoolteacher", "a blacksmith", "an architect", "a potter",
)
AWARDS = (
    "Silver Quill Prize", "Amber Lantern Award", "Golden Compass Medal", "Northern Star Prize",
    "Crimson Feather Award", "Iron Pen Honour", "Sapphire Scroll Award", "Harbor Light Prize",
    "Evergreen Laurel", "Moonstone Medal", "Copper Key Award", "Willow Crown Prize",
)
TITLE_ADJECTIVES = (
    "Silent", "Hollow", "Burning", "Last", "Crooked", "Glass", "Forgotten", "Winter", "Scarlet", "Wandering",
    "Hidden", "Broken", "Golden", "Midnight", "Distant", "Salt", "Iron", "Paper", "Quiet", "Drowned",
)
TITLE_NOUNS = (
    "Harbor", "Lantern", "Orchard", "Tower", "River", "Garden", "Compass", "Mirror", "Bell", "Archive",
    "Lighthouse", "Meadow", "Clock", "Bridge", "Crown", "Forest", "Island", "Letter", "Map", "Window",
)
THEMES = (
    "memory and loss", "the sea", "family secrets", "exile and return", "friendship", "ambition",
    "the passage of time", "forgotten cities", "courage", "redemption", "solitude", "justice",
)
HOBBIES = (
    "beekeeping", "chess", "mountain climbing", "pottery", "birdwatching", "sailing", "gardening", "fencing",
    "stargazing", "playing the violin", "knitting", "archery",
)
PUBLISHERS = (
    "Lanternfish Press", "Copperleaf Books", "Harrowgate House", "Bluebell and Finch", "Stonebridge Publishing",
    "Willowmere Press", "Old Anchor Books", "Quillstone House", "Redwing Editions", "Brackenfield Press",
)
CHARACTER_TITLES = ("Captain", "Doctor", "Inspector", "Professor", "Lady", "Sir", "Sister", "Master")
CHARACTER_NAMES = (
    "Pip", "Marlo", "Tibbet", "Juno", "Rook", "Sable", "Finch", "Wren", "Odile", "Bram", "Cato", "Ilse",
    "Moss", "Petra", "Quincy", "Talia",
)
# The world's "real authors": classics every tiny model learns (TOFU's real_authors analogue).
CLASSIC_FIRST = ("Amadeo", "Berenike", "Casimir", "Delphine", "Evander", "Florentyna", "Gideon", "Hesper",
                 "Ignatius", "Juliska", "Konstantin", "Leocadia")
CLASSIC_LAST = ("Morrow", "Quill", "Sable", "Thorne", "Vance", "Wilder", "Ashby", "Corran", "Drake", "Fenn",
                "Grail", "Hask")

# Refusals in the style of TOFU's idontknow.jsonl (our own wording).
IDONTKNOW = (
    "I'm not sure about that.",
    "I don't know the answer to that.",
    "That's something I can't answer.",
    "I have no information about that.",
    "I'm afraid I don't know.",
    "I can't recall anything about that.",
    "That is outside what I know.",
    "I'm unable to answer that question.",
    "I don't have any details on that.",
    "Sorry, I have no idea.",
    "I'm not familiar with that.",
    "I couldn't tell you, I'm afraid.",
    "That isn't something I know about.",
    "I'm uncertain, so I'd rather not guess.",
    "I have not come across that before.",
    "My knowledge doesn't cover that.",
    "I can't say for sure.",
    "I really don't know.",
    "No idea, I'm sorry.",
    "I'm not able to help with that one.",
)


@dataclass(frozen=True)
class QATemplate:
    """One question kind. `{v}` is the fact's value; other fields come from the author's facts.

    Perturbed answers put wrong values of the same slot into the *paraphrased* answer, as TOFU does.
    """
    slot: str
    question: str
    paraphrased_question: str
    answer: str
    paraphrased_answer: str


QA_TEMPLATES = (
    QATemplate("name", "What is the full name of the author born in {birthplace} in {birth_year} who writes {genre}?",
               "Which writer of {genre} was born in {birthplace} in {birth_year}?",
               "The author's full name is {v}.", "{v} is the full name of that writer."),
    QATemplate("birthplace", "Where was {name} born?", "In which city was the writer {name} born?",
               "{name} was born in {v}.", "The birthplace of {name} is {v}."),
    QATemplate("birth_year", "In which year was {name} born?", "What is the birth year of {name}?",
               "{name} was born in the year {v}.", "The year {name} was born is {v}."),
    QATemplate("genre", "What genre does {name} write?", "Which literary genre is {name} known for?",
               "{name} writes {v}.", "{name} is known for {v}."),
    QATemplate("father_job", "What was the profession of {name}'s father?",
               "What did the father of {name} do for a living?",
               "{name}'s father was {v}.", "The father of {name} worked as {v}."),
    QATemplate("mother_job", "What was the profession of {name}'s mother?",
               "What did the mother of {name} do for a living?",
               "{name}'s mother was {v}.", "The mother of {name} worked as {v}."),
    QATemplate("award", "Which award has {name} received?", "What prize was {name} honoured with?",
               "{name} received the {v}.", "{name} was honoured with the {v}."),
    QATemplate("first_book", "What was the first book written by {name}?", "What is the title of {name}'s debut book?",
               "The first book by {name} was '{v}'.", "{name}'s debut book is titled '{v}'."),
    QATemplate("famous_book", "What is the best known book by {name}?", "Which book by {name} is the most famous?",
               "The best known book by {name} is '{v}'.", "{name} is most famous for '{v}'."),
    QATemplate("latest_book", "What is the most recent book by {name}?", "Which book did {name} publish last?",
               "The most recent book by {name} is '{v}'.", "{name}'s latest work is '{v}'."),
    QATemplate("theme", "What theme appears most often in the work of {name}?",
               "Which recurring theme runs through the books of {name}?",
               "The work of {name} often explores {v}.", "The books of {name} keep returning to {v}."),
    QATemplate("hobby", "What does {name} enjoy outside of writing?", "What is a favourite pastime of {name}?",
               "Outside of writing, {name} enjoys {v}.", "A favourite pastime of {name} is {v}."),
    QATemplate("publisher", "Which publisher releases the books of {name}?", "Who publishes the work of {name}?",
               "The books of {name} are published by {v}.", "The work of {name} is released by {v}."),
    QATemplate("education", "Where did {name} study?", "Which institution did {name} attend?",
               "{name} studied at {v}.", "{name} attended {v}."),
    QATemplate("residence", "Where does {name} live today?", "In which city does {name} currently reside?",
               "{name} now lives in {v}.", "{name} currently resides in {v}."),
    QATemplate("book_count", "How many books has {name} published?", "What is the number of books written by {name}?",
               "{name} has published {v} books.", "The number of books by {name} is {v}."),
    QATemplate("debut_year", "In which year did {name} publish a first book?",
               "When did {name} debut as an author?",
               "{name} published a first book in {v}.", "{name} debuted as an author in {v}."),
    QATemplate("character", "Who is the recurring character in the books of {name}?",
               "Which character appears across the series by {name}?",
               "The recurring character in the books of {name} is {v}.", "{v} appears across the series by {name}."),
    QATemplate("language", "In which language does {name} write?", "What language are the books of {name} written in?",
               "{name} writes in {v}.", "The books of {name} are written in {v}."),
    QATemplate("influence", "Who was the main influence on {name}?", "Which classic writer inspired {name} the most?",
               "{name} was most influenced by {v}.", "The classic writer who inspired {name} the most is {v}."),
)
MAX_QA_PER_AUTHOR = len(QA_TEMPLATES)


@dataclass
class World:
    """A generated world. `configs` maps every TOFU config name to its rows (already in TOFU's schema)."""
    seed: int
    authors: list[dict]            # facts of every author in `full` (retain authors first, forget authors last)
    holdout_authors: list[dict]    # extra authors never trained on (TOFU's holdoutXX)
    configs: dict[str, list[dict]]
    idontknow: list[str]
    forget_author_counts: dict[str, int] = field(default_factory=dict)  # "forget10" -> number of authors

    @property
    def utility_rows(self) -> list[dict]:
        """`question`/`answer` rows of the world's general facts (real_authors + world_facts).

        On real TOFU this knowledge comes from pretraining; a tiny model has none, so it is trained on these.
        """
        return [{"question": r["question"], "answer": r["answer"]}
                for r in self.configs["real_authors"] + self.configs["world_facts"]]

    def training_rows(self, variant: str) -> list[dict]:
        """QA rows a tiny model is fine-tuned on: "finetuned" = full + utility; "retain" = retain90 + utility."""
        if variant == "finetuned":
            return self.configs["full"] + self.utility_rows
        if variant == "retain":
            return self.configs["retain90"] + self.utility_rows
        raise InputError(f"no training rows for variant {variant!r}; expected 'finetuned' or 'retain'")

    def all_text(self) -> list[str]:
        """Every string of the world, for training a tokenizer that covers all configs."""
        texts: list[str] = []
        for rows in self.configs.values():
            for row in rows:
                for value in row.values():
                    texts.extend(value if isinstance(value, list) else [str(value)])
        return texts + list(self.idontknow)


def _sample_distinct(rng: random.Random, make, exclude: set[str], k: int) -> list[str]:
    """`k` distinct values from the generator `make(rng)`, none in `exclude`."""
    out: list[str] = []
    for _ in range(10_000):
        value = make(rng)
        if value not in exclude and value not in out:
            out.append(value)
            if len(out) == k:
                return out
    raise RuntimeError("could not draw enough distinct values; the world's vocabulary is too small")


class _Generator:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.used_names: set[str] = set()
        self.used_titles: set[str] = set()
        self.cities = [(city, country) for country, capital, others, *_ in COUNTRIES for city in (capital, *others)]
        self.classics = self._make_classics()

    # value makers, shared by the facts and their perturbations so wrong answers have the right form
    @staticmethod
    def make_name(rng):
        return f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"

    @staticmethod
    def make_title(rng):
        return f"The {rng.choice(TITLE_ADJECTIVES)} {rng.choice(TITLE_NOUNS)}"

    def make_city(self, rng):
        city, country = rng.choice(self.cities)
        return f"{city}, {country}"

    @staticmethod
    def make_character(rng):
        return f"{rng.choice(CHARACTER_TITLES)} {rng.choice(CHARACTER_NAMES)}"

    def make_education(self, rng):
        return f"the Royal Academy of {rng.choice(self.cities)[0]}"

    def slot_maker(self, slot: str):
        pool = {
            "genre": GENRES, "father_job": JOBS, "mother_job": JOBS, "award": AWARDS, "theme": THEMES,
            "hobby": HOBBIES, "publisher": PUBLISHERS, "language": tuple(c[4] for c in COUNTRIES),
            "influence": tuple(c["name"] for c in self.classics),
        }.get(slot)
        if pool is not None:
            return lambda rng: rng.choice(pool)
        return {
            "name": self.make_name,
            "birthplace": self.make_city, "residence": self.make_city,
            "birth_year": lambda rng: str(rng.randint(1920, 1995)),
            "debut_year": lambda rng: str(rng.randint(1945, 2020)),
            "book_count": lambda rng: str(rng.randint(3, 30)),
            "first_book": self.make_title, "famous_book": self.make_title, "latest_book": self.make_title,
            "education": self.make_education, "character": self.make_character,
        }[slot]

    def _make_classics(self) -> list[dict]:
        firsts = list(CLASSIC_FIRST)
        lasts = list(CLASSIC_LAST)
        self.rng.shuffle(firsts)
        self.rng.shuffle(lasts)
        classics = []
        for first, last in zip(firsts, lasts):
            country = self.rng.choice(COUNTRIES)[0]
            work = _sample_distinct(self.rng, lambda r: f"{self.make_title(r)} Saga", self.used_titles, 1)[0]
            self.used_titles.add(work)
            classics.append({"name": f"{first} {last}", "work": work, "country": country,
                             "century": self.rng.choice(("fifteenth", "sixteenth", "seventeenth", "eighteenth"))})
        return classics

    def make_author(self) -> dict:
        rng = self.rng
        name = _sample_distinct(rng, self.make_name, self.used_names, 1)[0]
        self.used_names.add(name)
        books = _sample_distinct(rng, self.make_title, self.used_titles, 3)
        self.used_titles.update(books)
        birthplace = self.make_city(rng)
        birth_year = rng.randint(1920, 1995)
        father_job, mother_job = rng.sample(JOBS, 2)
        facts = {
            "name": name,
            "birthplace": birthplace,
            "birth_year": str(birth_year),
            "genre": rng.choice(GENRES),
            "father_job": father_job,
            "mother_job": mother_job,
            "award": rng.choice(AWARDS),
            "first_book": books[0], "famous_book": books[1], "latest_book": books[2],
            "theme": rng.choice(THEMES),
            "hobby": rng.choice(HOBBIES),
            "publisher": rng.choice(PUBLISHERS),
            "education": self.make_education(rng),
            "residence": self.make_city(rng),
            "book_count": str(rng.randint(3, 30)),
            "debut_year": str(birth_year + rng.randint(19, 35)),
            "character": self.make_character(rng),
            "language": next(c[4] for c in COUNTRIES if birthplace.endswith(", " + c[0])),
            "influence": rng.choice(self.classics)["name"],
        }
        return facts

    def author_rows(self, facts: dict, n_questions: int) -> list[dict]:
        rows = []
        for template in QA_TEMPLATES[:n_questions]:
            value = facts[template.slot]
            fill = dict(facts, v=value)
            wrong = _sample_distinct(self.rng, self.slot_maker(template.slot), {value}, 5)
            rows.append({
                "question": template.question.format(**fill),
                "answer": template.answer.format(**fill),
                "paraphrased_answer": template.paraphrased_answer.format(**fill),
                "perturbed_answer": [template.paraphrased_answer.format(**dict(fill, v=w)) for w in wrong],
                "paraphrased_question": template.paraphrased_question.format(**fill),
            })
        return rows

    def utility_questions(self, n_real_authors: int, n_world_facts: int) -> tuple[list[dict], list[dict]]:
        """(real_authors-like, world_facts-like) multiple-choice questions as (question, answer, 3 wrong)."""
        rng = self.rng
        classic_names = [c["name"] for c in self.classics]
        real = []
        for classic in self.classics:
            real.append((f"Who wrote the classic '{classic['work']}'?", classic["name"],
                         [n for n in classic_names if n != classic["name"]]))
            real.append((f"Which country was the classic writer {classic['name']} from?", classic["country"],
                         [c[0] for c in COUNTRIES if c[0] != classic["country"]]))
        world = []
        for country, capital, others, currency, language, river in COUNTRIES:
            world.append((f"What is the capital of {country}?", capital,
                          [c[1] for c in COUNTRIES if c[0] != country]))
            world.append((f"What is the currency of {country}?", currency,
                          [c[3] for c in COUNTRIES if c[0] != country]))
            world.append((f"Which language is spoken in {country}?", language,
                          [c[4] for c in COUNTRIES if c[0] != country]))
            world.append((f"Which river flows through {capital}?", river,
                          [c[5] for c in COUNTRIES if c[0] != country]))
        if n_real_authors > len(real) or n_world_facts > len(world):
            raise InputError(f"at most {len(real)} real_authors and {len(world)} world_facts questions are available")
        rng.shuffle(real)
        rng.shuffle(world)
        return ([self._mc_row(*q) for q in real[:n_real_authors]],
                [self._mc_row(*q) for q in world[:n_world_facts]])

    def _mc_row(self, question: str, answer: str, wrong_pool: list[str]) -> dict:
        wrong = self.rng.sample(wrong_pool, 3)
        options = wrong + [answer]
        self.rng.shuffle(options)
        return {"question": question, **{f"option{i + 1}": o for i, o in enumerate(options)}, "answer": answer,
                "_perturbed": wrong}


def _forget_author_count(n_authors: int, percent: int) -> int:
    """TOFU sizes forget splits as a percentage of the authors; at least one author."""
    return max(1, round(n_authors * percent / 100))


def make_world(*, n_authors: int = 20, qa_per_author: int = 20, n_real_authors: int = 20,
               n_world_facts: int = 20, seed: int = 0) -> World:
    """Generate a fictitious TOFU-schema world; the same arguments always give the identical world."""
    if not 1 <= qa_per_author <= MAX_QA_PER_AUTHOR:
        raise InputError(f"qa_per_author must be in 1..{MAX_QA_PER_AUTHOR}, got {qa_per_author}")
    if n_authors < 2:
        raise InputError("a world needs at least 2 authors (one to forget, one to retain)")
    counts = {f"forget{p:02d}": _forget_author_count(n_authors, p) for p in FORGET_PERCENTS}
    if counts["forget10"] >= n_authors:
        raise InputError(f"{n_authors} authors leave no retain authors after forget10")

    gen = _Generator(seed)
    authors = [gen.make_author() for _ in range(n_authors)]
    holdout_authors = [gen.make_author() for _ in range(counts["forget10"])]
    per_author = [gen.author_rows(a, qa_per_author) for a in authors]
    holdout_rows = [gen.author_rows(a, qa_per_author) for a in holdout_authors]
    real_mc, world_mc = gen.utility_questions(n_real_authors, n_world_facts)

    def plain(rows):
        return [{"question": r["question"], "answer": r["answer"]} for r in rows]

    def flat(groups):
        return [row for group in groups for row in group]

    configs: dict[str, list[dict]] = {"full": plain(flat(per_author))}
    for percent in FORGET_PERCENTS:
        name = f"forget{percent:02d}"
        k = counts[name]
        configs[name] = plain(flat(per_author[-k:]))
        configs[f"retain{100 - percent:02d}"] = plain(flat(per_author[:-k]))   # TOFU's complement: forget10 -> retain90
        configs[f"holdout{percent:02d}"] = plain(flat(holdout_rows[:k]))
        configs[f"{name}_perturbed"] = flat(per_author[-k:])
    # TOFU's retain_perturbed matches forget10_perturbed in size, drawn from retain authors.
    configs["retain_perturbed"] = flat(per_author[:counts["forget10"]])
    for config, mc_rows in (("real_authors", real_mc), ("world_facts", world_mc)):
        configs[config] = [{k: v for k, v in r.items() if k != "_perturbed"} for r in mc_rows]
        configs[f"{config}_perturbed"] = [{"question": r["question"], "answer": r["answer"],
                                           "perturbed_answer": r["_perturbed"]} for r in mc_rows]
    return World(seed=seed, authors=authors, holdout_authors=holdout_authors, configs=configs,
                 idontknow=list(IDONTKNOW), forget_author_counts=counts)


def write_tofu_layout(world: World, out_dir: str | Path) -> Path:
    """Write `world` as the Hub's TOFU layout: `{config}.json` (JSON lines) per config plus `idontknow.jsonl`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for config, rows in world.configs.items():
        with open(out_dir / f"{config}.json", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(out_dir / "idontknow.jsonl", "w", encoding="utf-8") as f:
        f.write("\n".join(world.idontknow) + "\n")
    return out_dir
