"""The demo's two scenarios as data: three disjoint prompt sets, the hint and the scorer.

- "student": homework help that does not read as AI-written: plain sentences (no bold, lists, headers or
  "Final Answer" line) and short (at most 40 words). SmolLM2-135M already writes plain prose about 95%
  of the time, so the length part is what leaves room to learn (base rate about 0.11 in the CPU
  prototype); the on-topic part keeps short evasions from scoring.
- "teacher": grading comments on a short student answer that are specific (mention something from the
  answer), friendly (a warm or affirming word, or speaking to the student), not a rubric template and at
  most 40 words. The base model's rate is about 0.09; it almost never writes a warm word unprompted,
  and even with the user's hint it satisfies this teacher only about 0.19 of the time
  (`benchmarks/bench_hinted_teacher.py`): a preference beyond SmolLM2-135M.
- "explainer": the student's questions, asked by someone with the opposite preference: a full explanation
  of at least `MIN_DETAILED_WORDS` words, on topic, in any format, its client asking for up to
  `EXPLAINER_MAX_TOKENS` tokens (the base model scored 0.44 on the evaluation prompts, docs/results.md
  "Two tenants"). The student and the explainer are the two tenants of `orl demo --two-tenants`
  (issue 47): what one wants, the other asks the assistant to undo.

Prompts are tasks where style, not correctness, is judged (the 135M model is weak at arithmetic).
Each scenario has three disjoint prompt sets (issue 48): sessions ask the train prompts; the promotion
gate asks the gate prompts (a seeded shuffle of the same pool holds them out) to choose which versions
to serve; the demo's evaluation asks the evaluation prompts, written apart from both on 2026-12-04 and
never used to select a version or tune a setting, so its figures are not chosen on the set they report.
Reads and writes no topics or object keys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from orl.gate.scoring import (
    LENGTH,
    MIN_DETAILED_WORDS,
    TOO_SHORT,
    Scorer,
    explainer_score,
    student_score,
    teacher_score,
)
from orl.schemas.errors import ConfigError

HELD_OUT_COUNT = 16
# The explainer's client lets an answer run this long: at 96 tokens SmolLM2's answers stop near 80 words.
EXPLAINER_MAX_TOKENS = 160
SPLIT_SEED = 0


@dataclass(frozen=True)
class Scenario:
    """One simulated user's preference: what it asks, what it wants, and how that is scored."""

    name: str
    description: str
    prompts: tuple[str, ...]  # the pool split into train and gate prompts
    train_prompts: tuple[str, ...]  # the sessions ask these
    gate_prompts: tuple[str, ...]  # the promotion gate asks these (held out from `prompts`)
    eval_prompts: tuple[str, ...]  # the demo's evaluation asks these, and nothing else does
    hint: str  # the full preference, as a directive correction spells it out
    scorer: Scorer
    length_check: str = LENGTH  # the violation of the user's word limit (restated by `restate_length`)
    max_tokens: int | None = None  # the response limit this user's client asks for (None: --max-tokens)


STUDENT_PROMPTS = (
    # math
    "How do I find the area of a circle with radius 3 cm?",
    "How do I turn the fraction 2/5 into a decimal?",
    "How do I solve 4x - 7 = 9?",
    "What is the least common multiple of 6 and 8?",
    "How do I work out 25% of 60?",
    "Why do the angles of a triangle add up to 180 degrees?",
    "How do I find the median of 5, 2, 9, 4 and 7?",
    "What does it mean for two lines to be parallel?",
    "How do I expand 3(x + 4)?",
    "How can I estimate 49 times 21 in my head?",
    "Is -3 bigger than -5 on a number line?",
    "How do I change 1.5 kilometres into metres?",
    # science
    "Why does a metal spoon feel colder than a wooden one?",
    "What do red blood cells do?",
    "Why does the Moon have phases?",
    "What is the difference between a physical and a chemical change?",
    "How does a magnet pick up paper clips?",
    "Why do leaves change colour in autumn?",
    "What happens to water molecules when water boils?",
    "How do vaccines help the immune system?",
    "Why do we see lightning before we hear thunder?",
    "What is friction and how does it slow things down?",
    "How do bees help flowers make seeds?",
    # grammar
    "When should I write 'their', 'there' or 'they're' in my essay?",
    "What is the difference between 'affect' and 'effect'?",
    "How do I fix a run-on sentence?",
    "What is a simile? Give me one about rain.",
    "When do I use a semicolon?",
    "What is the past tense of 'swim'?",
    "How can I tell if a word is an adverb?",
    "What is the subject in the sentence 'The tall dog barked loudly'?",
    "Should I write 'fewer apples' or 'less apples'?",
    "What makes a good closing sentence for a paragraph?",
    "What is the passive voice and when should I avoid it?",
    # history
    "Why did the Romans build so many roads?",
    "What was the Magna Carta and why does it matter?",
    "Why did the Titanic sink?",
    "How did the Industrial Revolution change the way people worked?",
    "Who was Cleopatra?",
    "Why was the printing press important?",
    "What was the Silk Road used for?",
    "Why did people in the Middle Ages build castles?",
    "What happened at the Boston Tea Party?",
    "Why did the ancient Egyptians build pyramids?",
)

# (question, short student answer): the teacher grades the answer; each answer has a content word to cite.
TEACHER_ITEMS = (
    ("Why do we wear coats in winter?", "Coats trap warm air next to our body so we lose less heat."),
    ("What is 7 times 8?", "I think it is 56 because eight sevens make 56."),
    ("Name a renewable energy source.", "Wind power, because the wind never runs out."),
    ("What does a thermometer measure?", "It measures temperature, like how hot the oven is."),
    ("Why do plants need sunlight?", "They use sunlight to make food from water and air."),
    ("What is a verb?", "A verb is an action word like jump or run."),
    (
        "Who built the Great Wall of China?",
        "Emperors had soldiers and farmers build it to keep out invaders.",
    ),
    ("What is the capital of France?", "Paris, which is also famous for the Eiffel Tower."),
    ("Why is the ocean salty?", "Rivers carry salt from rocks into the sea and it stays there."),
    ("What is half of 36?", "Half of 36 is 18 because 18 plus 18 is 36."),
    ("What is an island?", "Land with water all around it, like Hawaii."),
    ("Why do birds migrate?", "They fly south to find food when it gets cold."),
    ("What is a mammal?", "An animal with fur that feeds milk to its babies, like a dog."),
    ("What does the stomach do?", "It mixes food with acid to break it down."),
    ("Why did the Pilgrims sail to America?", "They wanted freedom to practise their religion."),
    ("What is a noun?", "A noun is a person, place or thing, like teacher or school."),
    ("How many sides does a hexagon have?", "Six sides, like the cells in a honeycomb."),
    ("What is evaporation?", "When water heats up and turns into vapour that rises."),
    ("Why do we have rules at school?", "Rules keep everyone safe and make the classroom fair."),
    ("What is 3/4 of 20?", "It is 15 because a quarter of 20 is 5 and three of those is 15."),
    ("What did the Wright brothers invent?", "They built the first airplane that flew with an engine."),
    ("What is a compound word?", "Two words joined together, like sunflower."),
    ("Why do volcanoes erupt?", "Magma pushes up from under the ground until it bursts out."),
    ("What is the opposite of 'ancient'?", "Modern, like the new phones we have today."),
    ("Why do we recycle?", "So less rubbish goes to landfill and we save materials."),
    ("What is a food chain?", "It shows who eats who, like grass, rabbit, fox."),
    ("Which planet is closest to the Sun?", "Mercury, and it is very hot in the daytime."),
    ("What is a fossil?", "The remains of an old plant or animal turned to stone."),
    ("Why did the Great Fire of London spread so fast?", "The houses were wooden and close together."),
    ("What is an adjective?", "A describing word, like fluffy in fluffy cat."),
    ("What is 100 minus 37?", "63, I counted up from 37 to 100."),
    ("What is gravity?", "A force that pulls things down toward the Earth."),
    ("What is a pronoun?", "A word used instead of a name, like she or they."),
    ("Why do we need to drink water?", "Our bodies are mostly water and we lose it when we sweat."),
    ("What is a democracy?", "A country where people vote for their leaders."),
    ("How do you find the perimeter of a rectangle?", "Add up all four sides of the shape."),
    (
        "Why do shadows change during the day?",
        "The Sun moves across the sky so the light comes from new angles.",
    ),
    ("What is a synonym for 'happy'?", "Joyful, like how I feel on my birthday."),
    ("What was the Stone Age?", "A long time ago when people made tools out of stone."),
    ("Why does a ball roll down a hill?", "Gravity pulls it and the slope lets it roll."),
    ("What is a prime number?", "A number only divisible by 1 and itself, like 7."),
    ("What are the three states of matter?", "Solid, liquid and gas, like ice, water and steam."),
    ("Why did knights wear armour?", "To protect themselves from swords and arrows in battle."),
    ("What is a haiku?", "A short poem with three lines of 5, 7 and 5 syllables."),
)

# The evaluation's prompts: the same subjects and kinds of question as the pool, none of them in it, with about
# as many content words each (relevance looks for them): 3.3 on average against the pool's 3.2 (student).
STUDENT_EVAL_PROMPTS = (
    "How do I round 3.47 to one decimal place?",
    "How do I find the perimeter of a square with sides of 5 cm?",
    "How do I simplify the fraction 12/18?",
    "How do I work out 15% of 200?",
    "Why do ice cubes float in a glass of water?",
    "How does the heart pump blood around the body?",
    "Why is the sky blue on a sunny day?",
    "How do plants take in water from the soil?",
    "What is the difference between a noun and a verb?",
    "When should I put a comma before 'and' in a list?",
    "What is a metaphor? Give me one about the wind.",
    "Why is the plural of 'mouse' written 'mice' and not 'mouses'?",
    "Why did the Vikings sail so far in their longships?",
    "Who was Julius Caesar and why is he remembered?",
    "Why was the invention of the wheel important?",
    "How did the first Olympic Games begin?",
)
TEACHER_EVAL_ITEMS = (
    ("Why do we brush our teeth?", "To clean off the germs that make holes in our teeth."),
    ("What is 9 times 6?", "It is 54 because six nines make 54."),
    ("What does a compass show?", "It points north so you can find your way."),
    ("Why do leaves fall in autumn?", "The tree stops feeding them when the days get cold."),
    ("What is an adverb?", "A word that tells how something happens, like quickly."),
    ("Who was the first person to walk on the Moon?", "Neil Armstrong, in 1969 on Apollo 11."),
    ("What is the capital of Japan?", "Tokyo, which is a very big and busy city."),
    ("Why does it rain?", "Water in the clouds gets heavy and falls down as drops."),
    ("What is double 45?", "90, because 45 plus 45 is 90."),
    ("What is a peninsula?", "Land with water on three sides, like Italy."),
    ("Why do bears hibernate?", "They sleep through winter because there is little food."),
    ("What is an insect?", "A small animal with six legs, like an ant."),
    ("What do the lungs do?", "They breathe in air and take oxygen into the blood."),
    ("What does a verb tense show?", "It shows when something happens, like past or future."),
    ("How many minutes are in two hours?", "120 minutes, because each hour has 60."),
    ("Why did people build canals?", "To move heavy goods by boat across the country."),
)

STUDENT_HINT = (
    "Answer in under 40 words, in plain sentences. "
    "Do not use bold text, lists, headers or a 'Final Answer' line, and stay on the question."
)
EXPLAINER_HINT = (
    f"Explain it fully, in at least {MIN_DETAILED_WORDS} words: say why it works, give an example and stay "
    "on the question."
)
TEACHER_HINT = (
    "Reply to the student in one or two friendly sentences, under 40 words: start with a warm word such as "
    "'Nice' or 'Great' and name something specific from their answer. No score, rubric labels or lists."
)


def grading_prompt(question: str, answer: str) -> str:
    """The teacher scenario's prompt for one item."""
    return f"Grade this answer to '{question}': '{answer}'"


def split_prompts(
    prompts: tuple[str, ...], held_out_count: int = HELD_OUT_COUNT, seed: int = SPLIT_SEED
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(train, held_out): a seeded shuffle, the last `held_out_count` held out; each keeps the list order."""
    if not 0 < held_out_count < len(prompts):
        raise ConfigError(f"held_out_count must be between 1 and {len(prompts) - 1}, got {held_out_count}")
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    held = set(order[-held_out_count:])
    train = tuple(p for i, p in enumerate(prompts) if i not in held)
    return train, tuple(p for i, p in enumerate(prompts) if i in held)


def make_scenario(
    name: str,
    description: str,
    prompts: tuple[str, ...],
    eval_prompts: tuple[str, ...],
    hint: str,
    scorer: Scorer,
    length_check: str = LENGTH,
    max_tokens: int | None = None,
) -> Scenario:
    """A scenario whose pool `prompts` is split into train and gate prompts; ConfigError if the evaluation's
    prompts repeat or meet the pool."""
    if len(set(eval_prompts)) != len(eval_prompts) or set(eval_prompts) & set(prompts):
        raise ConfigError(f"scenario {name!r}: evaluation prompts must be distinct and outside the pool")
    train, gate = split_prompts(prompts)
    return Scenario(
        name, description, prompts, train, gate, eval_prompts, hint, scorer, length_check, max_tokens
    )


STUDENT = make_scenario(
    "student",
    "A student wants homework help that does not look AI-written: short, plain sentences, on the question.",
    STUDENT_PROMPTS,
    STUDENT_EVAL_PROMPTS,
    STUDENT_HINT,
    student_score,
)
EXPLAINER = make_scenario(
    "explainer",
    f"A learner wants the student's questions explained in full: at least {MIN_DETAILED_WORDS} words, on the question.",
    STUDENT_PROMPTS,
    STUDENT_EVAL_PROMPTS,
    EXPLAINER_HINT,
    explainer_score,
    length_check=TOO_SHORT,
    max_tokens=EXPLAINER_MAX_TOKENS,
)
TEACHER = make_scenario(
    "teacher",
    "A teacher wants short, friendly grading comments that mention something specific from the answer.",
    tuple(grading_prompt(q, a) for q, a in TEACHER_ITEMS),
    tuple(grading_prompt(q, a) for q, a in TEACHER_EVAL_ITEMS),
    TEACHER_HINT,
    teacher_score,
)
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (STUDENT, EXPLAINER, TEACHER)}


def evaluation_prompts(scenario: Scenario, count: int) -> tuple[str, ...]:
    """The first `count` of the prompts the demo's evaluation asks (never the gate's or the sessions')."""
    return scenario.eval_prompts[:count]


def get_scenario(name: str) -> Scenario:
    """The scenario called `name`; a ConfigError lists the known ones."""
    if name not in SCENARIOS:
        raise ConfigError(f"unknown demo scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}")
    return SCENARIOS[name]
