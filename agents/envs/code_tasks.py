"""Procedural function-writing tasks for `code_tests`: a reference, hidden tests and wrong mutants.

Each template draws its constants and function name from the random generator, so one template
yields many distinct tasks. Expected outputs come from running the reference (our own code, in
this process); mutants that no hidden test catches are dropped, so every mutant kept is wrong
on at least one hidden test.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Template:
    """One parametric task family."""

    name: str
    make: Callable[[random.Random], dict[str, Any]]
    """Returns fn, signature, description, reference, mutants, inputs (argument tuples) and
    example (the index of the input shown in the prompt)."""


def _sum_multiples(rng: random.Random) -> dict[str, Any]:
    a, b = rng.choice([(3, 5), (2, 7), (3, 4), (4, 6), (5, 7), (2, 5)])
    fn = rng.choice(["sum_multiples", "multiples_total", "sum_of_multiples"])
    return dict(
        example=6,
        fn=fn, signature="n: int) -> int",
        description=f"returns the sum of all positive integers below n that are divisible by {a} or by {b}",
        reference=f"def {fn}(n):\n    return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)\n",
        mutants=[
            f"def {fn}(n):\n    return sum(i for i in range(1, n + 1) if i % {a} == 0 or i % {b} == 0)\n",
            f"def {fn}(n):\n    return sum(i for i in range(1, n) if i % {a} == 0 and i % {b} == 0)\n",
            f"def {fn}(n):\n    return sum(i for i in range(1, n) if i % {a} == 0)\n",
        ],
        inputs=[(1,), (a,), (b + 1,), (10,), (a * b,), (a * b + 1,), (rng.randint(20, 60),)],
    )


def _count_letters(rng: random.Random) -> dict[str, Any]:
    letters = rng.choice(["aeiou", "aeiouy", "xyz", "rst", "lmn"])
    fn = rng.choice(["count_letters", "letter_count", "count_chars"])
    words = ["Hello World", "RHYTHM", "Syzygy", "", "Programming is FUN", "Mississippi", "xylophone LAST"]
    return dict(
        example=0,
        fn=fn, signature="text: str) -> int",
        description=f"returns how many characters of text are one of the letters {letters!r}, ignoring case",
        reference=f"def {fn}(text):\n    return sum(1 for ch in text.lower() if ch in {letters!r})\n",
        mutants=[
            f"def {fn}(text):\n    return sum(1 for ch in text if ch in {letters!r})\n",
            f"def {fn}(text):\n    return len(set(ch for ch in text.lower() if ch in {letters!r}))\n",
            f"def {fn}(text):\n    return sum(1 for ch in text.lower() if ch not in {letters!r})\n",
        ],
        inputs=[(w,) for w in rng.sample(words, 5)] + [(letters.upper() + letters,)],
    )


def _clamp(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["clamp", "limit", "bound"])
    lo, hi = rng.randint(-10, 0), rng.randint(1, 20)
    return dict(
        example=1,
        fn=fn, signature="x: int, lo: int, hi: int) -> int",
        description="returns x limited to the range [lo, hi]: lo if x < lo, hi if x > hi, else x",
        reference=f"def {fn}(x, lo, hi):\n    return max(lo, min(x, hi))\n",
        mutants=[
            f"def {fn}(x, lo, hi):\n    return min(lo, max(x, hi))\n",
            f"def {fn}(x, lo, hi):\n    return max(lo, x)\n",
            f"def {fn}(x, lo, hi):\n    return lo if x > hi else (hi if x < lo else x)\n",
        ],
        inputs=[(lo - 5, lo, hi), (hi + 3, lo, hi), (lo, lo, hi), (hi, lo, hi), ((lo + hi) // 2, lo, hi), (0, 0, 0)],
    )


def _second_largest(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["second_largest", "runner_up", "second_max"])
    lists = [[rng.randint(-20, 50) for _ in range(rng.randint(3, 7))] for _ in range(3)]
    lists = [xs if len(set(xs)) > 1 else [*xs, max(xs) + 1] for xs in lists]
    return dict(
        example=4,
        fn=fn, signature="nums: list[int]) -> int",
        description="returns the second largest distinct value in nums (nums has at least two distinct values)",
        reference=f"def {fn}(nums):\n    return sorted(set(nums))[-2]\n",
        mutants=[
            f"def {fn}(nums):\n    return sorted(nums)[-2]\n",
            f"def {fn}(nums):\n    return sorted(set(nums))[1]\n",
            f"def {fn}(nums):\n    return max(nums)\n",
        ],
        inputs=[([5, 5, 3],), ([1, 2],), ([9, 1, 9, 4, 9],), ([-3, -1, -2],), *[(xs,) for xs in lists]],
    )


def _is_palindrome(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["is_palindrome", "reads_same_backwards", "palindrome"])
    half = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 4)))
    mixed = "".join(c.upper() if rng.random() < 0.5 else c for c in half + half[::-1])
    phrases = ["A man, a plan, a canal: Panama", "No lemon, no melon", "Was it a car or a cat I saw?",
               "Step on no pets!", "Never odd or even", "Taco cat"]
    return dict(
        example=0,
        fn=fn, signature="text: str) -> bool",
        description="returns True if text reads the same forwards and backwards when you ignore case and "
        "keep only letters and digits, else False",
        reference=f"def {fn}(text):\n    s = [c.lower() for c in text if c.isalnum()]\n    return s == s[::-1]\n",
        mutants=[
            f"def {fn}(text):\n    return text == text[::-1]\n",
            f"def {fn}(text):\n    s = text.lower()\n    return s == s[::-1]\n",
            f"def {fn}(text):\n    s = [c for c in text if c.isalnum()]\n    return s == s[::-1]\n",
        ],
        inputs=[(rng.choice(phrases),), (mixed,), (half + "x",), ("",), ("ab",), ("Racecar",), ("abca",)],
    )


def _running_sum(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["running_sum", "prefix_sums", "cumulative_sum"])
    xs = [rng.randint(-9, 9) for _ in range(rng.randint(3, 6))]
    return dict(
        example=4,
        fn=fn, signature="nums: list[int]) -> list[int]",
        description="returns the list of running totals: element i is nums[0] + ... + nums[i]",
        reference=f"def {fn}(nums):\n    out, total = [], 0\n    for x in nums:\n        total += x\n        out.append(total)\n    return out\n",
        mutants=[
            f"def {fn}(nums):\n    out, total = [], 0\n    for x in nums:\n        out.append(total)\n        total += x\n    return out\n",
            f"def {fn}(nums):\n    return [sum(nums[:i]) for i in range(1, len(nums))]\n",
            f"def {fn}(nums):\n    return [x * (i + 1) for i, x in enumerate(nums)]\n",
        ],
        inputs=[([],), ([5],), ([1, 2, 3],), ([3, -3, 3],), (xs,)],
    )


def _caesar(rng: random.Random) -> dict[str, Any]:
    k = rng.randint(1, 25)
    fn = rng.choice(["shift_letters", "caesar", "rotate_letters"])
    return dict(
        example=0,
        fn=fn, signature="text: str) -> str",
        description=f"shifts every lowercase letter {k} places forward in the alphabet, wrapping from 'z' "
        "back to 'a'; all other characters stay the same",
        reference=f"def {fn}(text):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in text)\n",
        mutants=[
            f"def {fn}(text):\n    return ''.join(chr(ord(c) + {k}) if 'a' <= c <= 'z' else c for c in text)\n",
            f"def {fn}(text):\n    return ''.join(chr((ord(c) - 97 - {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in text)\n",
            f"def {fn}(text):\n    return ''.join(chr((ord(c.lower()) - 97 + {k}) % 26 + 97) if c.isalpha() else c for c in text)\n",
        ],
        inputs=[("abc",), ("xyz",), ("Hello, World!",), ("",), ("zebra 42",)],
    )


def _digit_sum(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["digit_sum", "sum_digits", "add_digits"])
    return dict(
        example=4,
        fn=fn, signature="n: int) -> int",
        description="returns the sum of the decimal digits of n; for a negative n use its absolute value",
        reference=f"def {fn}(n):\n    return sum(int(d) for d in str(abs(n)))\n",
        mutants=[
            f"def {fn}(n):\n    return sum(int(d) for d in str(n) if d.isdigit()) if n >= 0 else -sum(int(d) for d in str(-n))\n",
            f"def {fn}(n):\n    return len(str(abs(n)))\n",
            f"def {fn}(n):\n    return sum(int(d) for d in str(abs(n))[1:])\n",
        ],
        inputs=[(0,), (7,), (123,), (-45,), (rng.randint(1000, 99999),), (-rng.randint(100, 999),)],
    )


def _dedupe(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["dedupe", "unique_in_order", "remove_duplicates"])
    xs = [rng.randint(0, 5) for _ in range(8)]
    return dict(
        example=4,
        fn=fn, signature="items: list) -> list",
        description="returns items without repeated values, keeping the first occurrence of each and the original order",
        reference=f"def {fn}(items):\n    seen, out = set(), []\n    for x in items:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
        mutants=[
            f"def {fn}(items):\n    return sorted(set(items))\n",
            f"def {fn}(items):\n    return [x for x in items if items.count(x) == 1]\n",
            f"def {fn}(items):\n    out = []\n    for x in reversed(items):\n        if x not in out:\n            out.insert(0, x)\n    return out\n",
        ],
        inputs=[([],), ([3, 1, 3, 2, 1],), (["b", "a", "b"],), ([1, 1, 1],), (xs,)],
    )


def _fizzbuzz(rng: random.Random) -> dict[str, Any]:
    a, b = rng.choice([(3, 5), (2, 3), (3, 7), (4, 6)])
    w1, w2 = rng.choice([("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong")])
    fn = rng.choice(["fizz_word", "label", "game_word"])
    return dict(
        example=3,
        fn=fn, signature="n: int) -> str",
        description=f"returns '{w1}{w2}' if n is divisible by both {a} and {b}, '{w1}' if only by {a}, "
        f"'{w2}' if only by {b}, and otherwise str(n)",
        reference=(f"def {fn}(n):\n    if n % {a} == 0 and n % {b} == 0:\n        return '{w1}{w2}'\n"
                   f"    if n % {a} == 0:\n        return '{w1}'\n    if n % {b} == 0:\n        return '{w2}'\n    return str(n)\n"),
        mutants=[
            f"def {fn}(n):\n    if n % {a} == 0:\n        return '{w1}'\n    if n % {b} == 0:\n        return '{w2}'\n    return str(n)\n",
            f"def {fn}(n):\n    if n % {a} == 0 and n % {b} == 0:\n        return '{w1}{w2}'\n    if n % {a} == 0:\n        return '{w1}'\n    if n % {b} == 0:\n        return '{w2}'\n    return n\n",
            f"def {fn}(n):\n    if n % {a * b} == 0:\n        return '{w1}{w2}'\n    if n % {b} == 0:\n        return '{w1}'\n    if n % {a} == 0:\n        return '{w2}'\n    return str(n)\n",
        ],
        inputs=[(1,), (a,), (b,), (a * b,), (a * b * 2,), (rng.choice([7, 11, 13, 17]),)],
    )


def _count_long_words(rng: random.Random) -> dict[str, Any]:
    k = rng.randint(3, 5)
    fn = rng.choice(["count_long_words", "long_word_count", "words_longer_than"])
    pool = ["a", "to", "the", "cat", "tree", "house", "banana", "elephant", "sky", "river", "mountain", "go"]
    text = " ".join(rng.choice(pool) for _ in range(rng.randint(4, 8)))
    return dict(
        example=1,
        fn=fn, signature="text: str) -> int",
        description=f"returns how many words in text (separated by whitespace) have more than {k} characters",
        reference=f"def {fn}(text):\n    return sum(1 for w in text.split() if len(w) > {k})\n",
        mutants=[
            f"def {fn}(text):\n    return sum(1 for w in text.split() if len(w) >= {k})\n",
            f"def {fn}(text):\n    return sum(1 for w in text.split(' ') if len(w) > {k - 1})\n",
            f"def {fn}(text):\n    return len([c for c in text if c != ' ']) // {k + 1}\n",
        ],
        inputs=[("",), (text,), ("a bb ccc dddd eeeee ffffff",), ("the  quick   brown fox",), ("abcdef",), ("one\ttwo three four",)],
    )


def _rotate(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["rotate_right", "rotate", "shift_right"])
    return dict(
        example=5,
        fn=fn, signature="items: list, k: int) -> list",
        description="returns a new list with items rotated k places to the right (k may be larger than the "
        "length; an empty list stays empty)",
        reference=f"def {fn}(items, k):\n    if not items:\n        return []\n    k %= len(items)\n    return items[-k:] + items[:-k] if k else list(items)\n",
        mutants=[
            f"def {fn}(items, k):\n    if not items:\n        return []\n    k %= len(items)\n    return items[k:] + items[:k]\n",
            f"def {fn}(items, k):\n    if not items:\n        return []\n    return items[-k:] + items[:-k]\n",
            f"def {fn}(items, k):\n    return items[-k:] + items[:-k]\n",
        ],
        inputs=[([1, 2, 3, 4, 5], 2), ([1, 2, 3], 0), ([1, 2, 3], 4), ([], 3), (["a", "b"], 1), ([1, 2, 3, 4], rng.randint(5, 11))],
    )


def _chunk(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["chunk", "split_into_chunks", "batches"])
    n = rng.randint(5, 9)
    return dict(
        example=4,
        fn=fn, signature="items: list, size: int) -> list[list]",
        description="splits items into consecutive lists of length size; the last list may be shorter",
        reference=f"def {fn}(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]\n",
        mutants=[
            f"def {fn}(items, size):\n    return [items[i:i + size] for i in range(0, len(items) - size + 1, size)]\n",
            f"def {fn}(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size + 1)]\n",
            f"def {fn}(items, size):\n    return [items[i:i + size - 1] for i in range(0, len(items), size)]\n",
        ],
        inputs=[([1, 2, 3, 4, 5], 2), ([1, 2, 3, 4], 2), ([], 3), ([1], 5), (list(range(n)), 3)],
    )


def _lcm(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["lcm", "least_common_multiple", "smallest_common_multiple"])
    return dict(
        example=5,
        fn=fn, signature="a: int, b: int) -> int",
        description="returns the least common multiple of two positive integers a and b",
        reference=f"def {fn}(a, b):\n    x, y = a, b\n    while y:\n        x, y = y, x % y\n    return a * b // x\n",
        mutants=[
            f"def {fn}(a, b):\n    return a * b\n",
            f"def {fn}(a, b):\n    return max(a, b)\n",
            f"def {fn}(a, b):\n    x, y = a, b\n    while y:\n        x, y = y, x % y\n    return x\n",
        ],
        inputs=[(4, 6), (3, 5), (7, 7), (1, 9), (12, 18), (rng.randint(2, 30), rng.randint(2, 30))],
    )


def _count_primes(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["count_primes", "primes_below", "num_primes"])
    return dict(
        example=6,
        fn=fn, signature="n: int) -> int",
        description="returns how many prime numbers are smaller than n",
        reference=(f"def {fn}(n):\n    count = 0\n    for k in range(2, n):\n"
                   f"        if all(k % d for d in range(2, int(k ** 0.5) + 1)):\n            count += 1\n    return count\n"),
        mutants=[
            f"def {fn}(n):\n    count = 0\n    for k in range(2, n + 1):\n        if all(k % d for d in range(2, int(k ** 0.5) + 1)):\n            count += 1\n    return count\n",
            f"def {fn}(n):\n    count = 0\n    for k in range(1, n):\n        if all(k % d for d in range(2, int(k ** 0.5) + 1)):\n            count += 1\n    return count\n",
            f"def {fn}(n):\n    return sum(1 for k in range(2, n) if k % 2)\n",
        ],
        inputs=[(0,), (2,), (3,), (10,), (11,), (30,), (rng.randint(31, 100),)],
    )


def _max_gap(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["max_step", "largest_jump", "max_gap"])
    xs = [rng.randint(-20, 20) for _ in range(rng.randint(3, 6))]
    return dict(
        example=5,
        fn=fn, signature="nums: list[int]) -> int",
        description="returns the largest absolute difference between two neighbouring elements of nums, "
        "or 0 when nums has fewer than two elements",
        reference=f"def {fn}(nums):\n    return max((abs(a - b) for a, b in zip(nums, nums[1:])), default=0)\n",
        mutants=[
            f"def {fn}(nums):\n    return max((b - a for a, b in zip(nums, nums[1:])), default=0)\n",
            f"def {fn}(nums):\n    return max(nums) - min(nums) if nums else 0\n",
            f"def {fn}(nums):\n    return max((abs(a - b) for a, b in zip(nums, nums[2:])), default=0)\n",
        ],
        inputs=[([],), ([4],), ([1, 5, 2],), ([10, 3, 8, 1],), ([0, 9, 0],), (xs,)],
    )


def _title_words(rng: random.Random) -> dict[str, Any]:
    fn = rng.choice(["capitalize_words", "title_words", "upper_first"])
    pool = ["hello", "world", "iPhone", "eBay", "o'clock", "it's", "python", "data", "mIxEd", "x"]
    sentence = " ".join(rng.sample(pool, rng.randint(2, 4)))
    return dict(
        example=0,
        fn=fn, signature="text: str) -> str",
        description="returns text with the first letter of every space-separated word in upper case and "
        "the rest of each word unchanged",
        reference=f"def {fn}(text):\n    return ' '.join(w[:1].upper() + w[1:] for w in text.split(' '))\n",
        mutants=[
            f"def {fn}(text):\n    return text.title()\n",
            f"def {fn}(text):\n    return ' '.join(w[:1].upper() + w[1:] for w in text.split())\n",
            f"def {fn}(text):\n    return text[:1].upper() + text[1:]\n",
        ],
        inputs=[(sentence,), ("",), ("iPhone and eBay",), ("a  b",), ("it's o'clock",), ("hello world",)],
    )


TEMPLATES: tuple[Template, ...] = tuple(
    Template(f.__name__.lstrip("_"), f)
    for f in (
        _sum_multiples, _count_letters, _clamp, _second_largest, _is_palindrome, _running_sum, _caesar,
        _digit_sum, _dedupe, _fizzbuzz, _count_long_words, _rotate, _chunk, _lcm, _count_primes, _max_gap,
        _title_words,
    )
)


def _define(source: str, fn: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - our own template code, never model output
    f: Callable[..., Any] = namespace[fn]
    return f


def _call(f: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, f(*[list(a) if isinstance(a, list) else a for a in args])
    except Exception as exc:  # noqa: BLE001 - a mutant may crash; that counts as caught
        return False, exc


def make_task(template: Template, rng: random.Random) -> dict[str, Any]:
    """One dataset row for `code_tests` from a template."""
    spec = template.make(rng)
    fn = spec["fn"]
    reference = _define(spec["reference"], fn)
    tests = []
    expected_values = []
    for args in spec["inputs"]:
        ok, value = _call(reference, args)
        assert ok, f"{template.name}: reference failed on {args!r}: {value!r}"
        expected_values.append(value)
        tests.append(f"assert {fn}({', '.join(repr(a) for a in args)}) == {value!r}")
    mutants = []
    for src in spec["mutants"]:
        mutant = _define(src, fn)
        if any(_call(mutant, args) != (True, value) for args, value in zip(spec["inputs"], expected_values)):
            mutants.append(src)
    example_args, example_value = spec["inputs"][spec["example"]], expected_values[spec["example"]]
    example = f"{fn}({', '.join(repr(a) for a in example_args)}) == {example_value!r}"
    prompt = (
        f"Write a Python function `{fn}({spec['signature']}` that {spec['description']}.\n"
        f"Example: {example}"
    )
    return {
        "prompt": prompt,
        "reference": spec["reference"],
        "hidden_tests": "\n".join(tests) + "\n",
        "mutants": mutants,
        "entry_point": fn,
        "template": template.name,
    }
