// graphsafe: graph-safe GPU workspaces for CUDA Graph capture and replay. One include for all.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/backend.hpp>
#include <graphsafe/bindings.hpp>
#include <graphsafe/captured_graph.hpp>
#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/debug.hpp>
#include <graphsafe/error.hpp>
#include <graphsafe/extent.hpp>
#include <graphsafe/footprint.hpp>
#include <graphsafe/host_backend.hpp>
#include <graphsafe/plan.hpp>
#include <graphsafe/plan_layout.hpp>
#include <graphsafe/policies/capacity_bound.hpp>
#include <graphsafe/policies/exact_at_capture.hpp>
#include <graphsafe/policies/static_query_bound.hpp>
#include <graphsafe/sizing_policy.hpp>
#include <graphsafe/symbol.hpp>
#include <graphsafe/virtual_memory.hpp>
#include <graphsafe/workspace.hpp>
