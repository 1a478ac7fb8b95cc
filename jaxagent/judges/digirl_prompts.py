"""DigiRL's evaluator prompts: the system line, the "Your Turn" instruction and the few-shot exemplars of
`build_prompt_general` (9) and `build_prompt_webshop` (11) (DigiRL-agent/digirl:digirl/environment/android/
evaluate.py), each exemplar's Task/Q/A/Status text verbatim (typos included), in the original's order.

The exemplar screenshots are bundled in `jaxagent/judges/assets/digirl/` (Apache-2.0, see README.txt there), already
downscaled 4x exactly as `process_image` downscales them at call time, so the model gets the same pixels.
"""

from __future__ import annotations

import os
from typing import NamedTuple

DIGIRL_SYSTEM = "You're an expert in evaluating whether the Screenshot successfully completes the Task."
DIGIRL_YOUR_TURN = ("Task: {intent}\nRespond in this format:\nQ: What should I expect to see on the screenshot if "
                    "I've <repeat the task>?\nA: I should expect to see <first expectation, then what's in the given "
                    "screenshot.>\nStatus: success or failure (don't return anything else)\nStart with \"Q:\".")
DIGIRL_ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "digirl")


class DigiRLExemplar(NamedTuple):
  """One few-shot exemplar of DigiRL's evaluator: its screenshot (a file in `DIGIRL_ASSETS`) and its text."""

  image: str
  task: str
  q: str
  a: str
  status: str

  @property
  def text(self) -> str:
    return f"Task: {self.task}\nQ: {self.q}\nA: {self.a}\nStatus: {self.status}"

  @property
  def image_path(self) -> str:
    return os.path.join(DIGIRL_ASSETS, self.image)


# evaluate.py's `build_prompt_general` / `build_prompt_webshop` (commit c74ec34), verbatim and in order; the
# `# #i` comments are the original's indices into its prompt and `cot_image_list`.
DIGIRL_GENERAL_EXEMPLARS = (
    DigiRLExemplar("screenshot_menu.png",  # #0
                   "Open the settings.",
                   "What should I expect to see on the screenshot if I've opened the settings?",
                   "I should expect to see I'm in the settings app. The screenshot shows the home screen of a mobile "
                   "device, with various app icons displayed, including the settings app icon, but the settings app "
                   "is not opened.",
                   "failure"),
    DigiRLExemplar("screenshot_hotel.png",  # #1
                   "Find hotels in washington dc",
                   "What should I expect to see on the screenshot if I've searched for hotels in Washington, DC?",
                   "I should expect to see I'm in a search results page for hotels in Washington, DC. The screenshot "
                   'shows a Google search page with the search field populated with the query "hotels in washington '
                   'dc" and a list of suggested searches related to hotels in Washington, DC, but it does not show '
                   "any search results for hotels in Washington, DC.",
                   "failure"),
    DigiRLExemplar("screenshot_restaurant.png",  # #2
                   "What's a good restaurant in Portland?",
                   "What should I expect to see on the screenshot if I've searched for a good restaurant in "
                   "Portland?",
                   "I should expect to see I'm in a search results page for a good restaurant in Portland. The "
                   'screenshot shows a Google search page with a search input field for "good restaurant in '
                   'portland" and a map results preview showing business locations near Portland, like "Li Pigeon", '
                   '"Portland City Grill", and "Higgins",',
                   "success"),
    DigiRLExemplar("screenshot_foodmenu.png",  # #3
                   "What's on the menu at In-N-Out?",
                   "What should I expect to see on the screenshot if I've searched for the menu at In-N-Out?",
                   "I should expect to see a menu page for In-N-Out, including product names, thumbnails and prices. "
                   'The screenshot shows a Google search page with a search input field for "In-N-Out menu" and some '
                   "page snippets of In-N-Out indicating potential menu items, but does not actually show the actual "
                   "menu.",
                   "failure"),
    DigiRLExemplar("screenshot_news.png",  # #4
                   "What's the news in Suriname?",
                   "What should I expect to see on the screenshot if I've searched for the news in Suriname?",
                   "I should expect to see some news in Suriname, such as someone did something or some accident "
                   "happens in Suriname. The screenshot shows a Google search page with a search input field for "
                   '"Suriname news today" and some page snippets indicating potential news items, but does not '
                   "actually show the news.",
                   "failure"),
    DigiRLExemplar("screenshot_weather.png",  # #5
                   "What's the weather like in Chicago?",
                   "What should I expect to see on the screenshot if I've searched for the weather in Chicago?",
                   "I should expect to see some exact values like temperature, humidity, wind speed, and weather "
                   "condition in Chicago. The screenshot shows a Google search page with a search input field for "
                   '"weather in Chicago" and some page snippets indicating potential weather information. Although '
                   "one page snippet contains some weather information, the information is not comprehensive enough "
                   "to determine the weather in Chicago.",
                   "failure"),
    DigiRLExemplar("screenshot_alarm.png",  # #6
                   "Set an alarm for 6pm.",
                   "What should I expect to see on the screenshot if I've set an alarm for 6pm?",
                   "I should expect to see some alarms including a 6pm alarm activated in the clock app. The "
                   "screenshot shows an attempt to set an alarm for 6pm in the clock app, but the alarm is not set "
                   "yet.",
                   "failure"),
    DigiRLExemplar("screenshot_frenchnews_blocked.png",  # #7
                   "What's the news in French today?",
                   "What should I expect to see on the screenshot if I've searched for the news in French today?",
                   "I should expect to see some news in French today, such as someone did something or some accident "
                   "happens in French today. The screenshot shows I'm in the website france24.com but blocked with a "
                   "cookie consent banner.",
                   "failure"),
    DigiRLExemplar("screenshot_frenchnews_okay.png",  # #8
                   "What's the news in French today?",
                   "What should I expect to see on the screenshot if I've searched for the news in French today?",
                   "I should expect to see some news in French today, such as someone did something or some accident "
                   "happens in French today. The screenshot shows I'm in the website france24.com and can see the "
                   "news, like something about the Olympic flame.",
                   "success"),
)

DIGIRL_WEBSHOP_EXEMPLARS = (
    DigiRLExemplar("step1_bestbuy.png",  # #0
                   "Go to bestbuy.com",
                   "What should I expect to see on the screenshot if I've gone to bestbuy.com?",
                   "I should expect to see I'm in the Best Buy website, which usually shows the best buy logo with "
                   "some featured products and categories. The screenshot shows I'm searching for \"bestbuy.com\" in "
                   "the Google search (with some search suggestions) instead of being in the Best Buy website.",
                   "failure"),
    DigiRLExemplar("step1_costco.png",  # #1
                   "Go to costco.com",
                   "What should I expect to see on the screenshot if I've gone to costco.com?",
                   "I should expect to see I'm in the Costco website, which usually shows the homepage with some "
                   "featured products and categories. The screenshot shows I'm in the Costco website with some "
                   "featured products and categories.",
                   "success"),
    DigiRLExemplar("step2_bestbuy.png",  # #2
                   'Go to bestbuy.com, search for "macbook"',
                   "What should I expect to see on the screenshot if I've gone to bestbuy.com AND searched for "
                   '"macbook"?',
                   "I should expect to see I'm in the Best Buy website and search results for \"macbook\". The "
                   "screenshot shows I'm in the Best Buy website and have several search suggestions for \"macbook\", "
                   "but it does not show search results of the product, which usually includes price and the product "
                   "details.",
                   "failure"),
    DigiRLExemplar("step2_ebay.png",  # #3
                   'Go to ebay.com, search for "corsair k70"',
                   "What should I expect to see on the screenshot if I've gone to ebay.com AND searched for \"corsair "
                   'k70"?',
                   "I should expect to see I'm in the eBay website and search results for \"corsair k70\". The "
                   "screenshot shows I'm in the eBay ebay website with some search suggestions for \"corsair k70\", "
                   "but it does not show search results of the product, which usually includes price and the product "
                   "details.",
                   "failure"),
    DigiRLExemplar("step2_walmart.png",  # #4
                   'Go to walmart.com, search for "macbook air"',
                   "What should I expect to see on the screenshot if I've gone to walmart.com AND searched for "
                   '"macbook air"?',
                   "I should expect to see I'm in the Walmart website and search results for \"razer huntsman\". The "
                   "screenshot shows I'm in Google search with some search suggestions for \"macbook air\", not "
                   "Walmart.",
                   "failure"),
    DigiRLExemplar("step2_walmart2.png",  # #5
                   'Go to walmart.com, search for "razer huntsman"',
                   "What should I expect to see on the screenshot if I've gone to walmart.com AND searched for "
                   '"razer huntsman"?',
                   "I should expect to see I'm in the Walmart website and search results for \"razer huntsman\". The "
                   "screenshot shows I'm in the Walmart website, but there's no search results for \"razer huntsman\", "
                   "which usually includes the product details and price.",
                   "failure"),
    DigiRLExemplar("step2_ebay2.png",  # #6
                   'Go to ebay.com, search for "lenovo thinkpad"',
                   "What should I expect to see on the screenshot if I've gone to ebay.com AND searched for \"lenovo "
                   'thinkpad"?',
                   "I should expect to see I'm in the eBay website and search results for \"lenovo thinkpad\". The "
                   "screenshot shows I'm in the eBay website and have several search results for \"lenovo thinkpad\".",
                   "success"),
    DigiRLExemplar("step3_ebay.png",  # #7
                   'Go to ebay.com, search for "razer thresher", select the first entry',
                   "What should I expect to see on the screenshot if I've gone to ebay.com AND going to the first "
                   'entry of the search results of "razer thresher"?',
                   "I should expect to see I'm in the eBay website and detailed information of a razer thresher "
                   "product, like a big image of the product, the price, and the product details. The screenshot "
                   "shows I'm in the eBay website but with more than one search results for \"razer thresher\", which "
                   "means the user has not selected the first entry of the search results.",
                   "failure"),
    DigiRLExemplar("step3_target.png",  # #8
                   'Go to target.com, search for "razer kraken", and select the first entry',
                   "What should I expect to see on the screenshot if I've gone to target.com AND gone to the first "
                   'entry of the search results of "razer kraken"?',
                   "I should expect to see I'm in the Target website and can see detailed information of a razer "
                   "thresher product, like a big image of the product, the price, and the product details. The "
                   "screenshot shows I'm in Google Search, not in the Target website.",
                   "failure"),
    DigiRLExemplar("step3_ebay2.png",  # #9
                   'Go to ebay.com, search for "acer predator", and select the first entry',
                   "What should I expect to see on the screenshot if I've gone to ebay.com AND gone to the first "
                   'entry of the search results of "acer predator"?',
                   "I should expect to see I'm in the eBay website with detailed information of an acer predator "
                   "product, like a big image of the product, the price, and the product details. The screenshot "
                   "shows I'm in the eBay website and have more than one search results for \"acer predator\", which "
                   "means the user has not selected the first entry of the search results.",
                   "failure"),
    DigiRLExemplar("step3_bestbuy.png",  # #10
                   'Go to bestbuy.com, search for "macbook", select the first entry',
                   "What should I expect to see on the screenshot if I've gone to bestbuy.com AND gone to the first "
                   'entry of the search results of "macbook"?',
                   "I should expect to see I'm in the eBay website and detailed information of a macbook product, "
                   "like a big image of the product, the price, and the product details. The screenshot shows I'm in "
                   "the eBay website and have detailed information of Macbook Air, including the price and the "
                   "product details.",
                   "success"),
)

DIGIRL_EXEMPLARS = {"general": DIGIRL_GENERAL_EXEMPLARS, "webshop": DIGIRL_WEBSHOP_EXEMPLARS}
DIGIRL_TASK_SETS = ("general", "webshop", "zero_shot")
