"""Tasks with checked answers for a chat model: capitals, opposites, one-digit sums and
plurals.

Each kind is a list written here (no download) and a question template; a problem's
prompt is the question rendered with the model's chat template (``render``), so the task
file holds exactly the text the model reads, and a recording rebuilt from the file
decodes the same way. Answers are full sentences ("The opposite of "hot" is "cold"."),
so a kind is checked by ``checker.WordChecker`` over the kind's own answers: the answer
of a text is the last of them it contains as whole words (``--answer-words``). A
reference may list aliases, ``Kyiv|Kiev``: any of them is right.

Each kind is its own task file (``tasks/<kind>.jsonl``): one file's answers are one
vocabulary, so a capital is never read as an opposite. Problems are dealt to the splits
train, valid, test in the ratio 2 : 1 : 2 in a fixed order (every fifth problem,
positions 0-1 train, 2 valid, 3-4 test), so the splits never change with a seed.

    python -m evolve.data.sources.pairs.chat_tasks --tokenizer DIR --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evolve.data.sources.task.files import Problem, write_tasks

# country -> capital (aliases after "|"); no capital's name holds another's or a
# country's, so the last one named is the answer
CAPITALS = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("the United Kingdom", "London"), ("Ireland", "Dublin"),
    ("Belgium", "Brussels"), ("the Netherlands", "Amsterdam"), ("Switzerland", "Bern|Berne"),
    ("Austria", "Vienna"), ("Poland", "Warsaw"), ("the Czech Republic", "Prague"),
    ("Slovakia", "Bratislava"), ("Hungary", "Budapest"), ("Romania", "Bucharest"),
    ("Bulgaria", "Sofia"), ("Greece", "Athens"), ("Turkey", "Ankara"), ("Serbia", "Belgrade"),
    ("Croatia", "Zagreb"), ("Slovenia", "Ljubljana"), ("Bosnia and Herzegovina", "Sarajevo"),
    ("Albania", "Tirana"), ("North Macedonia", "Skopje"), ("Montenegro", "Podgorica"),
    ("Denmark", "Copenhagen"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"), ("Iceland", "Reykjavik|Reykjavík"), ("Estonia", "Tallinn"),
    ("Latvia", "Riga"), ("Lithuania", "Vilnius"), ("Belarus", "Minsk"),
    ("Ukraine", "Kyiv|Kiev"), ("Russia", "Moscow"), ("Moldova", "Chisinau|Chișinău"),
    ("Georgia", "Tbilisi"), ("Armenia", "Yerevan"), ("Azerbaijan", "Baku"),
    ("Kazakhstan", "Astana"), ("Uzbekistan", "Tashkent"), ("Mongolia", "Ulaanbaatar|Ulan Bator"),
    ("China", "Beijing|Peking"), ("Japan", "Tokyo"), ("South Korea", "Seoul"),
    ("North Korea", "Pyongyang"), ("India", "New Delhi"), ("Pakistan", "Islamabad"),
    ("Bangladesh", "Dhaka"), ("Nepal", "Kathmandu"), ("Sri Lanka", "Colombo|Sri Jayawardenepura Kotte"),
    ("Afghanistan", "Kabul"), ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("Syria", "Damascus"),
    ("Lebanon", "Beirut"), ("Jordan", "Amman"), ("Israel", "Jerusalem"),
    ("Saudi Arabia", "Riyadh"), ("Yemen", "Sanaa|Sana'a"), ("Oman", "Muscat"),
    ("the United Arab Emirates", "Abu Dhabi"), ("Qatar", "Doha"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Cambodia", "Phnom Penh"), ("Laos", "Vientiane"),
    ("Myanmar", "Naypyidaw|Naypyitaw"), ("Malaysia", "Kuala Lumpur"),
    ("Indonesia", "Jakarta"), ("the Philippines", "Manila"), ("Australia", "Canberra"),
    ("New Zealand", "Wellington"), ("Egypt", "Cairo"), ("Libya", "Tripoli"),
    ("Tunisia", "Tunis"), ("Algeria", "Algiers"), ("Morocco", "Rabat"), ("Sudan", "Khartoum"),
    ("Ethiopia", "Addis Ababa"), ("Kenya", "Nairobi"), ("Uganda", "Kampala"),
    ("Tanzania", "Dodoma"), ("Rwanda", "Kigali"), ("Nigeria", "Abuja"), ("Ghana", "Accra"),
    ("Senegal", "Dakar"), ("Mali", "Bamako"), ("Niger", "Niamey"), ("Angola", "Luanda"),
    ("Zambia", "Lusaka"), ("Zimbabwe", "Harare"), ("Mozambique", "Maputo"),
    ("Madagascar", "Antananarivo"), ("Namibia", "Windhoek"), ("Botswana", "Gaborone"),
    ("Cameroon", "Yaounde|Yaoundé"), ("Somalia", "Mogadishu"), ("Canada", "Ottawa"),
    ("the United States", "Washington"), ("Cuba", "Havana"), ("Jamaica", "Kingston"),
    ("Haiti", "Port-au-Prince"), ("the Dominican Republic", "Santo Domingo"),
    ("Honduras", "Tegucigalpa"), ("Nicaragua", "Managua"), ("Costa Rica", "San Jose|San José"),
    ("El Salvador", "San Salvador"), ("Colombia", "Bogota|Bogotá"), ("Venezuela", "Caracas"),
    ("Ecuador", "Quito"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Argentina", "Buenos Aires"), ("Uruguay", "Montevideo"),
    ("Paraguay", "Asuncion|Asunción"), ("Brazil", "Brasilia|Brasília"),
)

# adjective -> its opposite (aliases after "|"); each pair is asked both ways
OPPOSITES = (
    ("hot", "cold"), ("big", "small|little"), ("tall", "short"), ("fast", "slow"),
    ("happy", "sad|unhappy"), ("light", "dark|heavy"), ("old", "young|new"), ("rich", "poor"),
    ("strong", "weak"), ("hard", "soft|easy"), ("wet", "dry"), ("clean", "dirty"),
    ("full", "empty"), ("early", "late"), ("loud", "quiet|soft"), ("thick", "thin"),
    ("wide", "narrow"), ("deep", "shallow"), ("high", "low"), ("good", "bad|evil"),
    ("true", "false"), ("open", "closed|shut"), ("safe", "dangerous|unsafe"),
    ("cheap", "expensive"), ("sharp", "dull|blunt"), ("smooth", "rough"), ("sweet", "sour|bitter"),
    ("brave", "cowardly|afraid|scared"), ("kind", "cruel|unkind|mean"), ("polite", "rude|impolite"),
    ("simple", "complex|complicated"), ("near", "far"), ("first", "last"),
    ("inside", "outside"), ("public", "private"), ("ancient", "modern"), ("noisy", "quiet|silent"),
    ("beautiful", "ugly"), ("healthy", "unhealthy|sick|ill"), ("heavy", "light"),
    ("friendly", "unfriendly|hostile"), ("busy", "idle|free"), ("awake", "asleep"),
    ("alive", "dead"), ("calm", "angry|agitated|nervous"), ("careful", "careless"),
    ("correct", "incorrect|wrong"), ("possible", "impossible"), ("visible", "invisible"),
    ("honest", "dishonest"), ("patient", "impatient"), ("legal", "illegal"),
    ("wise", "foolish|unwise|stupid"), ("generous", "selfish|stingy|mean"),
    ("maximum", "minimum"), ("positive", "negative"), ("major", "minor"),
    ("innocent", "guilty"), ("tight", "loose"), ("fresh", "stale|rotten"),
    ("male", "female"), ("north", "south"), ("east", "west"), ("left", "right"),
    ("up", "down"), ("day", "night"), ("always", "never"), ("more", "less|fewer"),
    ("increase", "decrease"), ("win", "lose"), ("love", "hate"), ("buy", "sell"),
    ("push", "pull"), ("begin", "end|finish"), ("remember", "forget"), ("accept", "reject|refuse"),
    ("arrive", "depart|leave"), ("laugh", "cry"),
)

# noun -> its plural (aliases after "|")
PLURALS = (
    ("cat", "cats"), ("dog", "dogs"), ("house", "houses"), ("car", "cars"), ("tree", "trees"),
    ("book", "books"), ("apple", "apples"), ("chair", "chairs"), ("table", "tables"),
    ("bird", "birds"), ("flower", "flowers"), ("river", "rivers"), ("window", "windows"),
    ("door", "doors"), ("pencil", "pencils"), ("computer", "computers"), ("shoe", "shoes"),
    ("girl", "girls"), ("boy", "boys"), ("friend", "friends"), ("teacher", "teachers"),
    ("song", "songs"), ("cloud", "clouds"), ("star", "stars"), ("road", "roads"),
    ("garden", "gardens"), ("bottle", "bottles"), ("candle", "candles"), ("lamp", "lamps"),
    ("horse", "horses"), ("bus", "buses"), ("box", "boxes"), ("fox", "foxes"),
    ("glass", "glasses"), ("dish", "dishes"), ("church", "churches"), ("watch", "watches"),
    ("brush", "brushes"), ("class", "classes"), ("kiss", "kisses"), ("match", "matches"),
    ("wish", "wishes"), ("tax", "taxes"), ("beach", "beaches"), ("bench", "benches"),
    ("city", "cities"), ("baby", "babies"), ("story", "stories"), ("party", "parties"),
    ("lady", "ladies"), ("country", "countries"), ("family", "families"), ("cherry", "cherries"),
    ("key", "keys"), ("toy", "toys"), ("day", "days"), ("monkey", "monkeys"),
    ("leaf", "leaves"), ("knife", "knives"), ("wife", "wives"), ("wolf", "wolves"),
    ("half", "halves"), ("shelf", "shelves"), ("loaf", "loaves"), ("thief", "thieves"),
    ("potato", "potatoes"), ("tomato", "tomatoes"), ("hero", "heroes"), ("echo", "echoes"),
    ("piano", "pianos"), ("photo", "photos"), ("radio", "radios"), ("zoo", "zoos"),
    ("man", "men"), ("woman", "women"), ("child", "children"), ("tooth", "teeth"),
    ("foot", "feet"), ("mouse", "mice"), ("goose", "geese"), ("person", "people|persons"),
    ("ox", "oxen"), ("louse", "lice"), ("die", "dice"),
    ("sheep", "sheep"), ("deer", "deer"), ("fish", "fish|fishes"), ("moose", "moose"),
    ("cactus", "cacti|cactuses"), ("fungus", "fungi|funguses"), ("nucleus", "nuclei"),
    ("crisis", "crises"), ("analysis", "analyses"), ("thesis", "theses"),
    ("phenomenon", "phenomena"), ("criterion", "criteria"), ("datum", "data"),
    ("bacterium", "bacteria"), ("medium", "media|mediums"), ("index", "indices|indexes"),
    ("appendix", "appendices|appendixes"), ("matrix", "matrices|matrixes"),
    ("mango", "mangoes|mangos"), ("volcano", "volcanoes|volcanos"),
    ("roof", "roofs"), ("chief", "chiefs"), ("cliff", "cliffs"), ("belief", "beliefs"),
    ("puppy", "puppies"), ("berry", "berries"), ("fly", "flies"), ("spy", "spies"),
    ("valley", "valleys"), ("journey", "journeys"), ("donkey", "donkeys"),
    ("quiz", "quizzes"), ("bush", "bushes"), ("dress", "dresses"), ("lunch", "lunches"),
    ("address", "addresses"), ("fax", "faxes"), ("wax", "waxes"),
)

SUM_DIGITS = range(1, 10)            # every a + b with a, b one digit from 1 to 9

QUESTIONS = {
    "capitals": "What is the capital of {0}?",
    "opposites": "What is the opposite of \"{0}\"?",
    "sums": "What is {0} + {1}?",
    "plurals": "What is the plural of \"{0}\"?",
}
KINDS = tuple(QUESTIONS)
SPLIT_CYCLE = ("train", "train", "valid", "test", "test")     # 2 : 1 : 2


def pairs_of(kind: str) -> list[tuple[tuple, str]]:
    """(question arguments, reference answer) of every problem of a kind, in order."""
    if kind == "capitals":
        return [((c,), a) for c, a in CAPITALS]
    if kind == "opposites":
        out = [((w,), a) for w, a in OPPOSITES]
        back = [((a.split("|")[0],), w) for w, a in OPPOSITES]
        seen, rows = set(), []
        for args, ans in out + back:          # a word asked once, in its first direction
            if args[0] not in seen:
                seen.add(args[0])
                rows.append((args, ans))
        return rows
    if kind == "sums":
        return [((a, b), str(a + b)) for a in SUM_DIGITS for b in SUM_DIGITS]
    if kind == "plurals":
        return [((w,), a) for w, a in PLURALS]
    raise KeyError(kind)


def render(tokenizer, question: str) -> str:
    """The question as the chat model reads it: one user turn and the assistant's
    header, as the tokenizer's chat template writes them."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         tokenize=False, add_generation_prompt=True)


def problems(kind: str, tokenizer) -> list[Problem]:
    """The problems of a kind, each with its split (``SPLIT_CYCLE``)."""
    return [Problem(render(tokenizer, QUESTIONS[kind].format(*args)), answer,
                    SPLIT_CYCLE[i % len(SPLIT_CYCLE)])
            for i, (args, answer) in enumerate(pairs_of(kind))]


def write(folder: str | Path, tokenizer) -> dict:
    """Write ``<folder>/<kind>.jsonl`` for every kind; kind -> path."""
    folder = Path(folder)
    out = {}
    for kind in KINDS:
        out[kind] = folder / f"{kind}.jsonl"
        write_tasks(out[kind], problems(kind, tokenizer))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="a model folder with a chat template")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer    # lazy: an optional extra
    for kind, path in write(args.out, AutoTokenizer.from_pretrained(args.tokenizer)).items():
        print(f"{path}: {len(pairs_of(kind))} problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
