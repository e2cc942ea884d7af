#pragma once
/// \file The device_policy concept (core/device.hpp), under the name the device folder's users know.
#include <loom/core/device.hpp>
