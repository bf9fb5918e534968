#include <gtest/gtest.h>
TEST(QuantMatmul, Placeholder) {}
