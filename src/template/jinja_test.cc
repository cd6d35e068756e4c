#include <gtest/gtest.h>
#include "template/jinja.h"
TEST(Jinja, Smoke) { EXPECT_EQ(basalt::JinjaTemplate::parse("a{{ 1 + 2 }}").render(nlohmann::json::object()), "a3"); }
