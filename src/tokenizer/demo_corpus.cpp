// The English text make_demo_vocab() learns its merges from. Written for
// tandem: everyday sentences, numbers, punctuation and a little code, so that
// the merges cover the shapes a test prompt is likely to have.

#include "tokenizer/demo_vocab.h"

namespace tandem {

std::string_view demo_corpus() {
  return R"corpus(The kettle clicked off just as the rain started, so I poured the tea and sat by
the window.
On Monday we bought three apples, two loaves of bread, a dozen eggs and a bag of rice for $12.40.
The bus to the station leaves at 7:15 in the morning and again at 6:45 in the evening.
She said, "Don't forget your umbrella!" and I said I wouldn't, but of course I did.
Our neighbour's dog barks at the postman every day; the postman has started carrying biscuits.
It's a short walk to the park: left at the bakery, right at the library, then straight on.
We'll meet at the cafe at noon. If you're late, order me a coffee with milk and no sugar.
The recipe needs 250 grams of flour, 2 eggs, 100 ml of milk and a pinch of salt.
They've painted the kitchen yellow, which makes the small room feel warmer in winter.
How many chairs do we need for the party? Twelve, maybe fourteen if the cousins come.
I read about 30 pages a night, so the 480-page novel should take me about sixteen days.
The train was delayed by 25 minutes because of a broken signal near the bridge.
He keeps his keys in a blue bowl by the door, and he still loses them twice a week.
Water boils at 100 degrees Celsius at sea level, and freezes at 0 degrees.
My phone battery lasts about a day and a half; the old one barely lasted until lunch.
Please close the window before you leave, and turn off the lights in the hall.
The market opens at 8 on Saturdays and sells fruit, vegetables, cheese, fish and flowers.
We counted 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and then started again from the beginning.
In 2023 the town planted 1,500 trees along the river and built a new footbridge.
The meeting is on the 3rd floor, room 312, from 14:00 to 15:30 (bring your notes).
Tickets cost 9.99 for adults, 4.50 for children, and nothing at all for babies.
What time is it? It's half past four, and the shops close at six, so let's hurry.
I'd like a window seat, please; I always like to watch the clouds when I fly.
The garden has roses, tulips, daisies and a tall sunflower that leans toward the fence.
You can't park here between 9am and 5pm, except on Sundays and public holidays.
After dinner we washed the dishes, dried them, and put them back on the shelf.
The library card expired last month, so I renewed it online in about two minutes.
Remember: measure twice, cut once. That's what my grandfather always told me.
The temperature dropped to -5 overnight, and the puddles on the road turned to ice.
Sam's bike has a flat tyre again; he thinks there's a thorn stuck in the rubber.
A week has 7 days, a day has 24 hours, an hour has 60 minutes and a minute 60 seconds.
Most mornings I make toast with butter and jam, or porridge when it's cold outside.
The children built a sandcastle with four towers, a moat and a flag made of a leaf.
We're out of milk, bread and coffee; could you pick some up on your way home?
The printer on the second floor is jammed again, so use the one near the lift.
Her flight lands at 21:10, and the drive from the airport takes roughly 40 minutes.
I wrote the shopping list on the back of an envelope: soap, rice, onions, lemons, tea.
Every spring the swallows come back and build their nests under the roof.
Turn the oven to 180 degrees, bake for 35 minutes, then let the cake cool on a rack.
Is this seat taken? No, go ahead; my friend isn't coming after all.
The river rose by 2.5 metres after the storm, but the new wall kept the streets dry.
Cafe au lait, creme brulee and a slice of tarte tatin: the menu is small but good.
Numbers like 42, 365, 1024, 65536 and 3.14159 show up everywhere in everyday life.
The score was 3-2 at half time, and it ended 4-4 after a very late goal.
Don't worry about the mess; we'll tidy up tomorrow morning before the guests arrive.
# A small example in code:
def total_price(items, tax_rate=0.2):
    """Return the price of all items, with tax."""
    subtotal = sum(item["price"] * item["count"] for item in items)
    return round(subtotal * (1 + tax_rate), 2)

for i in range(10):
    if i % 2 == 0:
        print(f"{i} is even")
    else:
        print(f"{i} is odd")

int add(int a, int b) { return a + b; }
const list = [1, 2, 3].map((x) => x * 2);  // [2, 4, 6]
if (count >= 10 && !done) { count -= 1; } else { done = true; }
let name = "world"; console.log(`hello, ${name}!`);
SELECT name, age FROM people WHERE age > 30 ORDER BY name;
path = "/home/user/notes.txt"; url = "https://example.com/index.html?page=2"
x = {"a": 1, "b": [true, false, null]}
The end of the day came quietly: the lamps went on, the street went still, and the cat came home.
)corpus";
}

}  // namespace tandem
