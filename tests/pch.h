// Precompiled header for the tests: the heavy headers every test file includes.
#pragma once
#include <ATen/core/Tensor.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
