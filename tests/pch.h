// Precompiled header for the tests: the heavy headers every test file includes.
// c10/util/Logging.h (pulled in by ATen's operator headers) defines a glog-style CHECK that aborts
// instead of recording a Catch assertion; including it first and then Catch makes Catch's CHECK
// the one every test file sees (Logging.h's include guard keeps it from coming back).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Logging.h>
#undef CHECK
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
