// Instruction-set selection for the CPU kernels.
//
// Every kernel exists as a scalar reference and as vectorized variants. The
// best variant the CPU supports is chosen once at start-up; tests (and the
// TANDEM_ISA environment variable: scalar, avx2, avx512) can force another.
// Within one variant, results are bitwise reproducible; across variants they
// agree within the tolerances stated in tests/test_kernels.cpp.
#pragma once

#include <string>

namespace tandem::kernels {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

std::string isa_name(Isa isa);
// The most capable variant this CPU can run.
Isa best_supported_isa();
bool isa_supported(Isa isa);
// The variant in use (best supported, or TANDEM_ISA if set).
Isa active_isa();
// Forces a variant; throws tandem::Error if the CPU cannot run it.
void set_active_isa(Isa isa);

}  // namespace tandem::kernels
