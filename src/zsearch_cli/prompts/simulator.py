"""The ZeroSearch simulator's ``prompt`` mode: our own one-shot prompt for an untuned instruct
model (docs/methods.md §2; the paper prints no such prompt). The ``sft`` mode sends the paper's
Table 2 prompt instead (:func:`zsearch_cli.prompts.render_simulator_prompt`).

The example documents are ours, about 30 words each as Table 2 asks, and numbered "Doc i:" so
the answer comes back in the format the simulator's parser and the tags protocol expect.
"""

PROMPT_MODE_SYSTEM = (
    "You are the Google search engine. Given a query, you return search result snippets "
    "exactly as a web search engine would: short, factual, encyclopedic text, one result per "
    'line, each line starting with "Doc i:". You never answer the user directly and never '
    "add commentary."
)

PROMPT_MODE_USEFUL_EXAMPLE = """\
Query: who painted the starry night
Output:
Doc 1: The Starry Night is an oil-on-canvas painting by the Dutch Post-Impressionist painter Vincent van Gogh, painted in June 1889 while he stayed at the asylum of Saint-Rémy-de-Provence.
Doc 2: Vincent van Gogh painted The Starry Night from memory during the day, depicting the view from his east-facing window just before sunrise, with an idealized village added below.
Doc 3: Since 1941 The Starry Night has been held in the permanent collection of the Museum of Modern Art in New York City, where it is among the most viewed works.
Doc 4: Van Gogh (1853–1890) produced about 2,100 artworks in just over a decade, including The Starry Night, Sunflowers and The Potato Eaters, most of them in his final two years.
Doc 5: Art historians describe The Starry Night, painted by Vincent van Gogh, as a turning point toward the swirling brushwork and expressive color that define his late style."""

PROMPT_MODE_NOISY_EXAMPLE = """\
Query: who painted the starry night
Output:
Doc 1: A starry night sky is best observed far from city lights; amateur astronomers recommend moonless nights and letting your eyes adapt to the dark for twenty minutes.
Doc 2: Starry Night is also the name of a planetarium software package that lets users simulate the sky from any location on Earth at any date and time.
Doc 3: Post-Impressionism was a largely French art movement of roughly 1886 to 1905, reacting against Impressionism's concern with the naturalistic depiction of light and color.
Doc 4: Many famous paintings have been stolen from museums over the past century, and several of them have never been recovered despite large rewards being offered.
Doc 5: Night photography of stars requires a tripod, a wide-aperture lens and exposures of several seconds; longer exposures turn the stars into curved trails."""

PROMPT_MODE_USEFUL_TEMPLATE = (
    "Given a query, generate {k} useful documents for it, as search result snippets of about "
    "30 words each. The user is trying to answer the question: \"{question}\" whose answer is "
    "{answer}. The documents should contain useful information that helps answer the question.\n\n"
    "Here is an example of the format.\n\n{example}\n\n"
    "Now do the same for this query. Write exactly {k} documents, one per line, each starting "
    'with "Doc i:", and nothing else.\n\nQuery: {query}\nOutput:'
)

PROMPT_MODE_NOISY_TEMPLATE = (
    "Given a query, generate {k} noisy documents for it, as search result snippets of about "
    "30 words each. Noisy documents look like plausible search results for the query but are "
    "only loosely related to it: they are off-topic, incomplete or about a different sense of "
    "the words, and they do not answer it.\n\n"
    "Here is an example of the format.\n\n{example}\n\n"
    "Now do the same for this query. Write exactly {k} documents, one per line, each starting "
    'with "Doc i:", and nothing else.\n\nQuery: {query}\nOutput:'
)
