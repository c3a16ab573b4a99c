#pragma once
// The checks of a recipe that involve more than one key (divisibility, MoE against the
// layout, device limits), run by parse_recipe once every key is set. For recipe.cpp only.
#include <map>
#include <string>

#include "recipe/config.h"

namespace pentad::recipe {

// origins: "<section>.<name>" -> "file:line:col" of the keys the recipe set; name: the file.
// Throws pentad::Error naming the keys to change.
void check_combinations(const Config& c, const std::map<std::string, std::string>& origins,
                        const std::string& name);

}  // namespace pentad::recipe
